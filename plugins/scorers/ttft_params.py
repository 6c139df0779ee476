"""The parameters of ``ttft-cost-scorer`` (:mod:`.ttft_cost`), apart from the scorer so that its module holds the model.

Every field has a YAML alias (camelCase) and every number a bound; an unknown field is an error (``extra="forbid"``,
from :class:`epp.framework.plugins.Params`). One rule spans fields: ``fitPlacement`` needs ``spillRoom``. What each
field does: docs/configuration.md; the runs behind the switches: docs/routing.md.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from epp.framework.plugins import Params as PluginParams

from .ttft_bookings import PRIOR_SECONDS

__all__ = ["TtftCostParams"]


class TtftCostParams(PluginParams):
    """``ttft-cost-scorer``'s parameters (YAML names are the aliases); docs/configuration.md describes each."""

    prefill_seconds_per_token: float = Field(3.0e-5, alias="prefillSecondsPerToken", gt=0)
    step_overhead_seconds: float = Field(0.0055, alias="stepOverheadSeconds", ge=0)
    decode_seconds_per_sequence: float = Field(1.5e-5, alias="decodeSecondsPerSequence", ge=0)
    decode_seconds_per_context_token: float = Field(4.5e-8, alias="decodeSecondsPerContextToken", ge=0)
    max_batched_tokens: int = Field(8192, alias="maxBatchedTokens", gt=0)
    miss_weight: float = Field(10.0, alias="missWeight", ge=0)
    pressure_window: float = Field(0.0, alias="pressureWindow", ge=0)
    decode_weight: float = Field(0.25, alias="decodeWeight", ge=0)
    interference_weight: float = Field(0.5, alias="interferenceWeight", ge=0,
                                       description="charge for slowing the decodes running on e")
    output_ratio: float = Field(1.0, alias="outputRatio", ge=0,
                                description="expected output = max_tokens, else prompt x this")
    weigh_victims_by_output: bool = Field(False, alias="weighVictimsByOutput",
                                          description="interference counts running requests by output length")
    count_other_replicas: bool = Field(False, alias="countOtherReplicas",
                                       description="add the requests a scrape shows beyond this EPP's own")
    learning_rate: float = Field(0.05, alias="learningRate", ge=0, le=1,
                                 description="each sample's weight in the speed factor; 0: no learning")
    speed_prior_seconds: float = Field(PRIOR_SECONDS, alias="speedPriorSeconds", gt=0,
                                       description="seconds of answers the speed factor starts from, as if "
                                                   "they had matched the prediction")
    move_seconds: float = Field(0.0, alias="moveSeconds", ge=0,
                                description="added to every endpoint but the prompt's keeper")
    move_ratio: float = Field(0.0, alias="moveRatio", ge=0,
                              description="every endpoint but the prompt's keeper costs this much more")
    prefix_homes: bool = Field(False, alias="prefixHomes",
                               description="a prefix's second request keeps it at a home of its own "
                                           "(see prefix_homes)")
    prefix_match_info_producer_name: str | None = Field(None, alias="prefixMatchInfoProducerName")
    pending_steps: bool = Field(False, alias="pendingSteps",
                                description="queued prefill work computes in steps before this request's")
    pending_weight: float = Field(1.0, alias="pendingWeight", ge=0,
                                  description="each queued prefill token counts this many times")
    spill: bool = Field(False, alias="spill",
                        description="an idle endpoint is priced as a holder while every holder has queued work")
    spill_tokens: int = Field(2500, alias="spillTokens", ge=0,
                              description="the most prompt tokens a spill copies")
    spill_shares: int = Field(0, alias="spillShares", ge=0,
                              description="spill only a prefix this many requests matched (0: any)")
    spill_room: float = Field(0.0, alias="spillRoom", ge=0,
                              description="spill only while the shared prefixes fit in this share of the "
                                          "target's KV cache (0: anywhere)")
    spill_window: float = Field(30.0, alias="spillWindow", gt=0,
                                description="seconds a prefix stays in the shared working set unseen")
    fit_placement: bool = Field(False, alias="fitPlacement",
                                description="while the shared prefixes fit (spillRoom), they do not steer "
                                            "placement")
    fit_pending_weight: float = Field(1.0, alias="fitPendingWeight", ge=0,
                                      description="pendingWeight while the shared prefixes fit")
    book_whole_prompt: bool = Field(False, alias="bookWholePrompt",
                                    description="book and predict each request at its whole prompt")
    learn_decode_speed: bool = Field(False, alias="learnDecodeSpeed",
                                     description="decode terms use a speed learnt from answers' decode times, "
                                                 "not the time-to-first-token one")
    decode_remaining: bool = Field(False, alias="decodeRemaining",
                                   description="the decode term counts each running request only for the "
                                               "steps it has left")

    @model_validator(mode="after")
    def _fit_needs_room(self) -> "TtftCostParams":
        if self.fit_placement and not self.spill_room:
            raise ValueError("fitPlacement needs spillRoom > 0: the share of a server's KV the shared "
                             "prefixes must fit in")
        return self
