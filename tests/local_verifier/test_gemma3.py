"""The real Gemma 3 270M (``gemma3-270m``, Q4_K_M GGUF) end to end: greedy identical to
transformers on the same dequantized weights past the 512-token sliding window, verify
steps bitwise equal to plain decoding, batches and chunks bitwise invariant, and the
gateway serving it with drafts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import torch

from local_verifier.loader import GEMMA3_ALIAS, LoadedModel, load_model, resolve_spec
from tests.local_verifier.stepping import plain_decode, verify_batched

pytestmark = pytest.mark.timeout(1200)

CODE = "def add(a, b):\n    return a + b\n"
TEXTS = [
    CODE,
    "  leading spaces,   runs\t\ttabs\n\n\nand newlines",
    "emoji 🙂🚀 café naïve 日本語 안녕하세요",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
]
NEW_TOKENS = 8
ENGINE_ROWS = 80  # a step's rows at most: prompt budget + drafts
LOGITS_ATOL = 2e-3  # ours vs transformers, float32 on the same weights (values up to ~40)


@dataclass
class Gemma:
    lm: LoadedModel
    prompt: list[int]  # longer than the sliding window
    tokens: list[int]  # our greedy continuation, one token per step
    logits: torch.Tensor  # each of those steps' logits
    reference_logits: torch.Tensor  # transformers' at the same rows


def transformers_twin(lm: LoadedModel) -> Any:
    """transformers' Gemma 3 with this model's (dequantized, float32) weights."""
    import transformers

    cfg, m = lm.config, lm.model
    assert cfg.layer_types is not None and cfg.rope_local_theta is not None
    hf = transformers.Gemma3ForCausalLM(
        transformers.Gemma3TextConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.dim,
            intermediate_size=cfg.hidden_dim,
            num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads,
            num_key_value_heads=cfg.n_kv_heads,
            head_dim=cfg.head_dim,
            query_pre_attn_scalar=cfg.head_dim,
            sliding_window=cfg.sliding_window,
            layer_types=list(cfg.layer_types),
            rms_norm_eps=cfg.norm_eps,
            max_position_embeddings=cfg.max_seq_len,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_local_theta},
                "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            },
            tie_word_embeddings=True,
        )
    )
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    state = {"model.embed_tokens.weight": m.embed.weight, "model.norm.weight": m.norm.weight - 1}
    for i, block in enumerate(m.layers):
        p = f"model.layers.{i}."
        wq, wk, wv = block.attn.wqkv.weight.split([q, kv, kv])
        gate, up = block.ffn.w13.weight.chunk(2)
        state.update(
            {
                p + "self_attn.q_proj.weight": wq,
                p + "self_attn.k_proj.weight": wk,
                p + "self_attn.v_proj.weight": wv,
                p + "self_attn.o_proj.weight": block.attn.wo.weight,
                p + "self_attn.q_norm.weight": block.attn.q_norm.weight - 1,
                p + "self_attn.k_norm.weight": block.attn.k_norm.weight - 1,
                p + "mlp.gate_proj.weight": gate,
                p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": block.ffn.w2.weight,
                p + "input_layernorm.weight": block.attn_norm.weight - 1,
                p + "post_attention_layernorm.weight": block.post_attn_norm.weight - 1,
                p + "pre_feedforward_layernorm.weight": block.ffn_norm.weight - 1,
                p + "post_feedforward_layernorm.weight": block.post_ffn_norm.weight - 1,
            }
        )
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    return hf.eval()


@pytest.fixture(scope="module")
def gemma() -> Gemma:
    lm = load_model(GEMMA3_ALIAS, device="cpu", dtype="float32", max_seq_len=1024)
    assert lm.config.sliding_window == 512
    prompt = lm.tokenizer.encode(
        lm.tokenizer.apply_chat_template(
            [{"role": "user", "content": "Repeat this code exactly:\n" + CODE * 40}]
        )
    )
    assert len(prompt) > lm.config.sliding_window + 16
    hf = transformers_twin(lm)  # before any step: the weights still row-major
    tokens, logits = plain_decode(lm, prompt, NEW_TOKENS)
    with torch.no_grad():  # teacher-forced on our tokens: one forward
        ids = torch.tensor([prompt + tokens[:-1]])
        rows = hf(ids, logits_to_keep=NEW_TOKENS).logits[0].float()
    return Gemma(lm, prompt, tokens, logits, rows)


def test_greedy_identical_to_transformers_past_the_window(gemma: Gemma) -> None:
    """transformers' argmax at every row is our token (so its greedy decoding is ours)."""
    assert gemma.reference_logits.argmax(-1).tolist() == gemma.tokens
    torch.testing.assert_close(gemma.logits, gemma.reference_logits, atol=LOGITS_ATOL, rtol=0)


def test_chunks_drafts_and_batches_are_bitwise_plain(gemma: Gemma) -> None:
    """The prompt in two chunks, then the whole continuation as one verify step (a draft
    chain) batched with another sequence's prefill: every row's logits bitwise those of
    plain decoding."""
    other = gemma.lm.tokenizer.encode("Hello there, " * 20)
    rows = verify_batched(gemma.lm, gemma.prompt, gemma.tokens, other, split=300)
    assert torch.equal(rows, gemma.logits)


@pytest.mark.slow
def test_tokenizer_matches_transformers(gemma: Gemma) -> None:
    """Our SentencePiece tokenizer from the file's metadata vs transformers' from the same
    file (its merges derived from the vocabulary in Python: slow)."""
    from transformers import AutoTokenizer

    path, _ = resolve_spec(GEMMA3_ALIAS)
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ours = gemma.lm.tokenizer
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == hf.decode(ids) == text
    assert ours.encode("hi", add_special_tokens=True) == hf.encode("hi")


@pytest.fixture(scope="module")
def gemma_url(gemma: Gemma) -> Iterator[str]:
    from gateway.app import create_app
    from gateway.cli.serve import verifier_settings
    from local_verifier.engine import Engine
    from tests.gateway.servers import serve

    costs = [0.02 + 0.001 * rows for rows in range(ENGINE_ROWS + 1)]  # no calibration run
    engine = Engine(gemma.lm, max_draft=16, token_budget=ENGINE_ROWS - 16, row_costs=costs)
    app = create_app(verifier_settings(GEMMA3_ALIAS), engines={"local": engine})
    with serve(app) as url:
        yield url


def test_gateway_drafts_are_lossless(gemma_url: str) -> None:
    client = openai.OpenAI(base_url=f"{gemma_url}/v1", api_key="unused", max_retries=0)
    common: dict[str, Any] = {
        "model": GEMMA3_ALIAS,
        "messages": [{"role": "user", "content": f"Repeat this code exactly:\n{CODE}"}],
        "temperature": 0,
        "max_tokens": 24,
    }
    plain = client.chat.completions.create(**common, extra_body={"draftgate": {"draft": False}})
    text = plain.choices[0].message.content
    assert text
    raw = client.chat.completions.with_raw_response.create(
        **common, prediction={"type": "content", "content": text}
    )
    drafted = raw.parse()
    assert raw.headers["x-draftgate-prediction"] == "verified-locally"
    assert drafted.choices[0].message.content == text
    assert drafted.usage.completion_tokens_details.accepted_prediction_tokens > 0
