"""gRPC ``Reward``: validate, delegate to the models."""

from __future__ import annotations

import grpc

from strata.rpc import abort_invalid
from strata.v1 import common_pb2, reward_pb2, reward_pb2_grpc
from strata.validation import RequestError, check_prompt
from svc_reward.models import RewardModels


class RewardServicer(reward_pb2_grpc.RewardServicer):
    def __init__(self, models: RewardModels, max_items: int, max_text_chars: int) -> None:
        self._models = models
        self._max_items = max_items
        self._max_text_chars = max_text_chars

    def Score(self, request: reward_pb2.ScoreRequest, context: grpc.ServicerContext) -> reward_pb2.ScoreResponse:
        if not request.items:
            abort_invalid(context, "items", "must not be empty")
        if len(request.items) > self._max_items:
            abort_invalid(context, "items", f"at most {self._max_items} per request, got {len(request.items)}")
        if request.scorer not in (common_pb2.SCORER_UNSPECIFIED, common_pb2.SCORER_LIGHT, common_pb2.SCORER_STRONG):
            abort_invalid(context, "scorer", "must be SCORER_LIGHT or SCORER_STRONG")
        strong = request.scorer == common_pb2.SCORER_STRONG
        if strong and not self._models.has_strong:
            abort_invalid(context, "scorer", "no strong reward model is configured on this deployment")
        try:
            for i, item in enumerate(request.items):
                check_prompt(item.prompt, self._max_text_chars, field=f"items[{i}].prompt")
                if len(item.response) > self._max_text_chars:
                    raise RequestError(f"items[{i}].response", f"over the limit of {self._max_text_chars} characters")
                if "\x00" in item.response:
                    raise RequestError(f"items[{i}].response", "contains NUL bytes")
        except RequestError as exc:
            abort_invalid(context, exc.field, exc.problem)
        scores = self._models.score([i.prompt for i in request.items], [i.response for i in request.items], strong)
        return reward_pb2.ScoreResponse(
            scores=[reward_pb2.ItemScore(reward=r, reward_std=s) for r, s in zip(scores.rewards, scores.spreads,
                                                                                 strict=True)],
            rm_version=scores.version,
            scorer=common_pb2.SCORER_STRONG if strong else common_pb2.SCORER_LIGHT,
        )
