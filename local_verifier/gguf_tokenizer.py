"""The tokenizer of a GGUF file, rebuilt on the ``tokenizers`` library from ``tokenizer.ggml.*``
metadata: byte-level BPE (``gpt2``) or SentencePiece BPE with scores (``llama``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from local_verifier import families
from local_verifier.errors import ModelLoadError
from local_verifier.tokenizer import Tokenizer

Field = Callable[[str], Any]  # a metadata value by key (None where absent)

# llama.cpp pre-tokenizer names -> split regex (byte-level BPE vocabularies)
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {
    "default": _GPT2_SPLIT,
    "gpt2": _GPT2_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "qwen35": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4  # token types
SPACE = "\u2581"  # SentencePiece's visible space
SUPPORTED_MODELS = ("gpt2 (byte-level BPE)", "llama (SentencePiece BPE with scores)")


def tokenizer_from_metadata(field: Field, arch: str) -> Tokenizer:
    """The tokenizer of a GGUF file whose metadata ``field`` reads, for architecture ``arch``
    (what its family leaves implicit filled in, where a family reads it)."""
    family = families.for_gguf(arch)
    by_place = family is not None and family.vocab_by_place
    kind = field("tokenizer.ggml.model")
    tokens: list[str] = field("tokenizer.ggml.tokens")
    types: list[int] = field("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    if kind == "gpt2":
        backend = _byte_level(field, tokens)
    elif kind == "llama":
        if by_place:  # its tokens of spaces spelt as its tokenizer.json has them
            tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
        backend = _sentencepiece(field, tokens, by_place)
    else:
        raise ModelLoadError(
            f"unsupported GGUF tokenizer {kind!r}; supported: {', '.join(SUPPORTED_MODELS)}"
        )
    backend.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == _CONTROL
        ]
    )
    backend.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == _USER_DEFINED
        ]
    )

    def token_of(key: str) -> int | None:
        value = field(f"tokenizer.ggml.{key}")
        return None if value is None else int(value)

    bos, eos = token_of("bos_token_id"), token_of("eos_token_id")
    eos_ids = {
        i for i in (eos, token_of("eot_token_id"), token_of("eom_token_id")) if i is not None
    }
    template = field("tokenizer.chat_template")
    end = family.end_of_turn if family is not None else None
    if family is not None and end is not None and end in tokens:  # base models: no template
        eos_ids.add(tokens.index(end))
        template = template or family.chat_template
    named = {
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": token_of("unknown_token_id"),
        "pad_token": token_of("padding_token_id"),
    }
    return Tokenizer(
        backend,
        eos_ids=eos_ids,
        bos_id=bos,
        chat_template=template,
        special_tokens={k: tokens[v] for k, v in named.items() if v is not None},
        add_bos=bool(field("tokenizer.ggml.add_bos_token")),
    )


def _byte_level(field: Field, tokens: list[str]) -> BackendTokenizer:
    listed = field("tokenizer.ggml.merges")
    if not listed:
        raise ModelLoadError("the GGUF file's byte-level BPE vocabulary has no merges")
    merges = [tuple(m.split(" ", 1)) for m in listed]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    pre = field("tokenizer.ggml.pre") or "default"
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        split = [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(Regex(_GPT2_SPLIT), behavior="isolated"),
        ]
    elif pre in _PRE_SPLITS:
        split = [pre_tokenizers.Split(Regex(_PRE_SPLITS[pre]), behavior="isolated")]
    else:
        raise ModelLoadError(
            f"unsupported GGUF pre-tokenizer {pre!r}; supported: smollm, {', '.join(_PRE_SPLITS)}"
        )
    backend.pre_tokenizer = pre_tokenizers.Sequence([*split, byte_level])
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece(field: Field, tokens: list[str], by_place: bool) -> BackendTokenizer:
    """SentencePiece BPE with byte fallback. The merges are the file's, or those its
    vocabulary implies: every split of a token into two tokens, best first (by score; or,
    ``by_place``, for a vocabulary whose scores do not follow its merge order (Gemma's), by
    place in the vocabulary)."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    listed = field("tokenizer.ggml.merges")
    if listed:
        merges = [tuple(m.split(" ", 1)) for m in listed]
    else:
        scores = field("tokenizer.ggml.scores") or [0.0] * len(tokens)
        rank = [-i for i in range(len(tokens))] if by_place else scores
        merges = _implied_merges(tokens, vocab, rank)
    unk = field("tokenizer.ggml.unknown_token_id")
    backend = BackendTokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=None if unk is None else tokens[int(unk)],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", SPACE)]
    if field("tokenizer.ggml.add_space_prefix") is not False:  # llama.cpp's default: a prefix
        steps.insert(0, normalizers.Prepend(SPACE))
    backend.normalizer = normalizers.Sequence(steps)
    backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    decode: list[decoders.Decoder] = [
        decoders.Replace(SPACE, " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
    ]
    if len(steps) == 2:
        decode.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(decode)
    return backend


def _implied_merges(
    tokens: list[str], vocab: dict[str, int], rank: list[float]
) -> list[tuple[str, str]]:
    """Each token's splits into two vocabulary tokens, best rank first (ties: the longer
    left piece, then the longer right piece, then the token's place), as transformers
    derives them."""
    found: list[tuple[float, int, int, int, str, str]] = []
    for place, (token, score) in enumerate(zip(tokens, rank, strict=True)):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                found.append((-score, -cut, cut - len(token), place, left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]
