"""OpenAI's log-probabilities from vLLM's: the k most likely tokens, most likely first, at any temperature.

What vLLM 0.32 gives: with SamplingParams(logprobs=k), each position's logprobs are a dict
{token id: Logprob} that holds the sampled token first, then the k most likely tokens by rank
(k + 1 entries when the sampled token is not among them, k when it is). vLLM's own OpenAI server
then takes the first k entries of that dict as `top_logprobs` (chat) or the first k + 1 (completions),
so at temperature > 0 the list is the sampled token plus the top k - 1, in sampling order, not rank
order. OpenAI defines top_logprobs as the k most likely tokens; the sampled token is reported on its
own (`logprobs.content[i]`: token, logprob, bytes in chat; `tokens` / `token_logprobs` in completions).

The fix sorts each position's dict by logprob before vLLM's serving objects pick from it, so the
first k are the k most likely (the sampled token falls out unless it is one of them), and the
completions' legacy `top_logprobs` dicts are rebuilt with exactly those k (a dict is keyed by
text: of two tokens that decode alike, the less likely is keyed "token_id:<id>"). `fix_logprobs` installs
this on the serving objects of one engine, once; nothing else of vLLM's response building changes.

Which distribution: the engine's `logprobs_mode`, default `raw_logprobs`: log-softmax of the model's
own logits, before temperature, penalties, logit_bias, top-k/top-p and constraints. That is what
OpenAI reports (its logprobs do not change with temperature), so the values do not depend on the
sampling settings, and a constrained token can have a low logprob. A package that sets
`logprobs_mode: processed_logprobs` under engine: gets the distribution that was sampled from
instead (after temperature and the other processors); the ranking rule above holds either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_FIXED = "_llmserve_top_logprobs"


def most_likely_first(step: dict[int, Any]) -> dict[int, Any]:
    """One position's {token id: Logprob}, most likely first (ties keep vLLM's order)."""
    return dict(sorted(step.items(), key=lambda item: item[1].logprob, reverse=True))


def fix_logprobs(state: Any) -> None:
    """Make the chat and completion serving objects in `state` report the k most likely tokens."""
    chat = getattr(state, "openai_serving_chat", None)
    if chat is not None and not getattr(chat, _FIXED, False):
        _fix_chat(chat)
    completion = getattr(state, "openai_serving_completion", None)
    if completion is not None and not getattr(completion, _FIXED, False):
        _fix_completion(completion)


def _fix_chat(serving: Any) -> None:
    # OpenAIServingChat._get_top_logprobs(logprobs, top_logprobs, ...) keeps the first
    # `top_logprobs` entries of the dict in its order: given the dict sorted, those are the k most likely
    original = serving._get_top_logprobs

    def top_logprobs(logprobs: dict[int, Any], *args: Any, **kwargs: Any) -> Any:
        return original(most_likely_first(logprobs), *args, **kwargs)

    serving._get_top_logprobs = top_logprobs
    setattr(serving, _FIXED, True)


def _fix_completion(serving: Any) -> None:
    original = serving._create_completion_logprobs

    def completion_logprobs(
        token_ids: Sequence[int],
        top_logprobs: Sequence[dict[int, Any] | None],
        num_output_top_logprobs: int,
        tokenizer: Any,
        logprob_token_ids: list[int] | None = None,
        initial_text_offset: int = 0,
        return_as_token_id: bool | None = None,
    ) -> Any:
        result = original(
            token_ids,
            top_logprobs,
            num_output_top_logprobs,
            tokenizer,
            logprob_token_ids=logprob_token_ids,
            initial_text_offset=initial_text_offset,
            return_as_token_id=return_as_token_id,
        )
        if logprob_token_ids:  # the caller asked for given token ids: vLLM's answer stands
            return result
        as_id = serving.return_tokens_as_token_ids if return_as_token_id is None else return_as_token_id
        k = num_output_top_logprobs
        for i, step in enumerate(top_logprobs):
            if step is None or result.top_logprobs[i] is None:
                continue
            ranked = list(most_likely_first(step).items())
            ranked = ranked if k < 0 else ranked[:k]
            top: dict[str, float] = {}
            for token_id, lp in ranked:
                token = serving._get_decoded_token(lp, token_id, tokenizer, return_as_token_id=as_id)
                if token in top:
                    # two ids decode to the same text (partial UTF-8 bytes both decode to ""): the
                    # likelier keeps the text, the other is keyed "token_id:<id>" (vLLM's spelling
                    # for return_tokens_as_token_ids), so the dict still holds all k; vLLM's own dict
                    # let the later one overwrite the likelier one's value
                    token = f"token_id:{token_id}"
                top[token] = max(lp.logprob, -9999.0)
            result.top_logprobs[i] = top
        return result

    serving._create_completion_logprobs = completion_logprobs
    setattr(serving, _FIXED, True)
