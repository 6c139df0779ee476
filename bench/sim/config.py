"""Configuration of one simulated vLLM server: `SimConfig` and its `TimeModel`.

The time-model defaults describe Llama-3-8B (bf16) on one H100 SXM running vLLM V1.
They are first-order estimates derived from public hardware and model numbers, not
measurements; docs/simulator.md shows the arithmetic behind each constant.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["NATIVE_MAX_MODEL_LEN", "SimConfig", "TimeModel"]

# The simulated model's own context length (what vLLM reads from the model's config).
NATIVE_MAX_MODEL_LEN = 32768


class TimeModel(BaseModel):
    """Duration of one engine step, in simulated seconds.

    step = step_overhead_s
         + prefill_s_per_token * prefill tokens computed (cached prefix tokens cost nothing)
         + prefill_attn_s_per_pair * (query, key) pairs of those prefill tokens
         + decode_s_per_seq * decode sequences
         + attn_s_per_kv_token * KV tokens the decode sequences attend to
    then multiplied by a Gaussian factor (1 + jitter * N(0, 1)), clamped to [0.3, 1.7].
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # 16 GB of bf16 weights read once per step at ~3 TB/s (H100 SXM HBM3 peak is 3.35 TB/s),
    # plus kernel launch and scheduler overhead: the batch-1 inter-token latency.
    step_overhead_s: float = Field(0.0055, ge=0)
    # 2 * 8.03e9 FLOP per token at ~530 TFLOP/s (54% of the 989 TFLOP/s dense bf16 peak).
    prefill_s_per_token: float = Field(3.0e-5, ge=0)
    # Causal attention during prefill: 4 * 128 (head dim) * 32 heads * 32 layers = 0.52 MFLOP
    # per (query, key) pair at ~500 TFLOP/s.
    prefill_attn_s_per_pair: float = Field(1.0e-9, ge=0)
    # Per decoding sequence: LM head (128k vocab x 4096), sampling, detokenisation.
    decode_s_per_seq: float = Field(1.5e-5, ge=0)
    # KV read per attended token: 32 layers * 8 KV heads * 128 * 2 (K, V) * 2 bytes = 128 KiB
    # at ~2.9 TB/s effective.
    attn_s_per_kv_token: float = Field(4.5e-8, ge=0)
    # P/D: NIXL over 400 Gb/s RDMA moves 128 KiB per token at ~35 GB/s, after a fixed handshake.
    kv_transfer_latency_s: float = Field(0.002, ge=0)
    kv_transfer_s_per_token: float = Field(4.0e-6, ge=0)
    jitter: float = Field(0.0, ge=0, le=0.3)


class SimConfig(BaseModel):
    """Everything one simulated server needs; unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid")

    model: str = "sim-model"
    num_gpu_blocks: int = Field(2048, gt=0)
    block_size: int = Field(16, gt=0)
    max_num_seqs: int = Field(64, gt=0)
    max_num_batched_tokens: int = Field(8192, gt=0)
    # Longest prompt + output. -1 (the default) fits it to the KV cache, capped at the model's own
    # context length, as vLLM's `--max-model-len -1` does; a value the KV cache cannot hold is refused.
    max_model_len: int = -1
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    role: Literal["both", "prefill", "decode"] = "both"
    batching: Literal["continuous", "static", "dynamic"] = "continuous"
    # static/dynamic: batch size (default max_num_seqs); dynamic: longest wait for a full batch.
    max_batch_size: int | None = Field(None, gt=0)
    max_wait_time_s: float = Field(0.05, ge=0)
    time_scale: float = Field(1.0, gt=0)
    time_model: TimeModel = TimeModel()
    seed: int = 0
    # Seeds the root of the block-hash chain, like PYTHONHASHSEED does for vLLM.
    hash_seed: str = "0"
    # Path of a Hugging Face tokenizer.json (needs the `tokenizers` package); None = built-in.
    tokenizer: str | None = None
    # Mean output length when a request gives no max_tokens (then finish_reason is "stop").
    output_len_mean: int = Field(128, gt=0)
    kv_events_endpoint: str | None = None
    kv_events_topic: str | None = None
    kv_events_format: Literal["map", "array"] = "map"
    # None follows vLLM: bind for "*", "::", ipc:// and inproc://, connect otherwise.
    kv_events_bind: bool | None = None
    # None: on when adapters are preloaded (vLLM's --lora-modules needs --enable-lora), off otherwise, as in vLLM.
    enable_lora: bool | None = None
    lora_adapters: list[str] = []
    max_loras: int = Field(4, gt=0)
    max_waiting: int = Field(1000, ge=0)
    # P/D prefiller: how long finished blocks wait for the decoder to pull them
    # (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
    kv_hold_timeout_s: float = Field(480.0, ge=0)
    engine_id: str | None = None
    embedding_dim: int = Field(32, gt=0)
    failure_rate: float = Field(0.0, ge=0, le=1)
    failure_status: int = Field(503, ge=400, le=599)
    # A wedged server: "fail" answers every inference request with failure_status, "hang" holds it unanswered;
    # /metrics, /health and /v1/models keep answering either way. Changed at run time with POST /sim/fault.
    fault: Literal["ok", "fail", "hang"] = "ok"
    metrics_delay_s: float = Field(0.0, ge=0)
    v0_metrics: bool = False

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        if self.max_batch_size is not None and self.max_batch_size > self.max_num_seqs:
            raise ValueError("max_batch_size must not exceed max_num_seqs")
        self.max_model_len = self._fit_max_model_len()
        if self.enable_lora is None:
            self.enable_lora = bool(self.lora_adapters)
        elif self.lora_adapters and not self.enable_lora:
            raise ValueError("lora_adapters need enable_lora")
        return self

    def _fit_max_model_len(self) -> int:
        """The checked max_model_len: vLLM refuses to start when one sequence of that length
        cannot fit in the KV cache (`kv_cache_utils._check_enough_kv_cache_memory`)."""
        capacity = self.kv_capacity_tokens
        if self.max_model_len == -1:
            if capacity < 2:
                raise ValueError(f"a {capacity}-token KV cache cannot hold a prompt and an output token")
            return min(NATIVE_MAX_MODEL_LEN, capacity)
        if self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2, or -1 to fit the KV cache")
        if self.max_model_len > capacity:
            raise ValueError(
                f"The model's max seq len ({self.max_model_len}) is larger than the maximum number of "
                f"tokens that can be stored in KV cache ({capacity} = {self.num_gpu_blocks} blocks of "
                f"{self.block_size}). Try increasing `num_gpu_blocks` or decreasing `max_model_len` "
                "(-1 fits it to the KV cache)."
            )
        return self.max_model_len

    @property
    def batch_size(self) -> int:
        """Batch size used by the static and dynamic regimes."""
        return self.max_batch_size or self.max_num_seqs

    @property
    def kv_capacity_tokens(self) -> int:
        """Longest sequence (prompt + output) the KV cache can hold at all."""
        return self.num_gpu_blocks * self.block_size
