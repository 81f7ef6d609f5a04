"""``python -m vllm_hetero_spec``: the main job (``harness/main_job.py``)."""

from vllm_hetero_spec.harness.main_job import main

if __name__ == "__main__":
    main()
