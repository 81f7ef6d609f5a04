"""Everything that relates the draft and target vocabularies, built once per engine."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from vllm_hetero_spec.vocab.id_map import IdMap
from vllm_hetero_spec.vocab.intersection import VocabIntersection
from vllm_hetero_spec.vocab.retokenize import TokenEncoder
from vllm_hetero_spec.vocab.token_bytes import token_bytes_table


def _with_specials(tokenizer: PreTrainedTokenizerBase, table: list[bytes | None]) -> list[bytes | None]:
    """Text-level bytes: special tokens spell their literal content (``<|im_start|>``)
    so that a chat template written by one tokenizer reads as text to the other."""
    out = list(table)
    for tid, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if tid < len(out) and out[tid] is None:
            out[tid] = str(added).encode("utf-8")
    return out


def text_encoder(tokenizer: PreTrainedTokenizerBase, table: list[bytes | None]) -> TokenEncoder:
    """The encoder a bridge holds for ``tokenizer``, from its byte ``table``
    (:func:`token_bytes_table`): control tokens spelled literally."""
    return TokenEncoder(tokenizer, _with_specials(tokenizer, table))


@dataclass
class VocabBridge:
    """Tokenizers, per-token bytes and the shared vocabulary of a draft/target pair.

    ``*_bytes`` are the text of each id, ``None`` for control tokens; the encoders'
    tables instead spell control tokens literally (see :func:`text_encoder`).
    ``id_map``: where the vocabularies agree id for id (the same, or near-same), the
    map that carries the target's ids to the drafter without re-tokenization.
    """

    draft_tokenizer: PreTrainedTokenizerBase
    target_tokenizer: PreTrainedTokenizerBase
    intersection: VocabIntersection
    draft_encoder: TokenEncoder
    target_encoder: TokenEncoder
    same_vocab: bool
    draft_bytes: list[bytes | None]
    target_bytes: list[bytes | None]
    id_map: IdMap | None

    @classmethod
    def build(cls, draft_tokenizer: str, target_tokenizer: str, draft_vocab: int, target_vocab: int) -> "VocabBridge":
        """``*_vocab`` are the models' embedding sizes (may exceed the tokenizers').

        Built once per process for the same arguments: start-up validation and the
        drafter both need it, and with the engine in process (offline ``LLM`` with
        ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) that is the same process; loading
        a large tokenizer and tabulating its bytes takes seconds. Nothing mutates a
        bridge after it is built."""
        return _built(draft_tokenizer, target_tokenizer, draft_vocab, target_vocab)

    @classmethod
    def load(cls, draft_tokenizer: str, target_tokenizer: str, draft_vocab: int, target_vocab: int) -> "VocabBridge":
        """:meth:`build`, uncached."""
        d_tok, t_tok = load_tokenizer(draft_tokenizer), load_tokenizer(target_tokenizer)
        d_bytes = token_bytes_table(d_tok, draft_vocab)
        t_bytes = token_bytes_table(t_tok, target_vocab)
        inter = VocabIntersection.build(d_bytes, t_bytes)
        same = d_tok is t_tok or d_tok.get_vocab() == t_tok.get_vocab()
        d_enc, t_enc = text_encoder(d_tok, d_bytes), text_encoder(t_tok, t_bytes)
        id_map = IdMap.detect(d_enc.token_bytes, t_enc.token_bytes, d_enc.encode)
        return cls(d_tok, t_tok, inter, d_enc, t_enc, same, d_bytes, t_bytes, id_map)

    def active_id_map(self, setting: str) -> IdMap | None:
        """The id map the drafter reads the target's ids through under the ``id_map``
        setting (``auto``: wherever the vocabularies agree id for id; ``off``: never)."""
        return self.id_map if setting == "auto" else None

    @property
    def draft_prefix_ids(self) -> list[int]:
        """Ids the draft tokenizer puts before any text (e.g. Gemma's ``<bos>``)."""
        return self.draft_tokenizer.encode("", add_special_tokens=True)

    @property
    def draft_eos_ids(self) -> set[int]:
        eos = self.draft_tokenizer.eos_token_id
        return {eos} if eos is not None else set()


@lru_cache(maxsize=4)
def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """``path``'s tokenizer, loaded once per process: bridges of one tokenizer at other
    embedding sizes, and a process that checks several pairs (``advise``), share it.
    Loading parses the whole ``tokenizer.json`` in Python, which for a large vocabulary
    is most of a bridge's build. Nothing mutates a tokenizer after loading."""
    return AutoTokenizer.from_pretrained(path)


@lru_cache(maxsize=4)
def _built(draft_tokenizer: str, target_tokenizer: str, draft_vocab: int, target_vocab: int) -> VocabBridge:
    return VocabBridge.load(draft_tokenizer, target_tokenizer, draft_vocab, target_vocab)
