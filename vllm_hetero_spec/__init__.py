"""vllm_hetero_spec: speculative decoding in vLLM with a draft model of another vocabulary.

``register`` is the ``vllm.general_plugins`` entry point: vLLM calls it in every process
(API server, engine core, workers) before building configs or model runners.
"""

__version__ = "0.1.0"


def register() -> None:
    from vllm_hetero_spec import vllm_integration

    vllm_integration.apply()
