"""Requests an elastic engine can no longer serve finish with an error; they never hang
(``docs/elastic.md``, "When the accounting fails").

While its group's accounting cannot be reached (:meth:`SchedulerSide.fail_group`: a lease
replaced, a ledger that does not read) an engine maps nothing new: its grant is all it has. A
request that vLLM's scheduler cannot start with nothing running, in a step that scheduled
nothing, waits for memory nobody will free -- vLLM's busy loop would step it forever. Once the
failure outlived one more look at the group (:data:`GRACE_SECONDS`), such a request is
finished the way vLLM finishes a request it cannot serve: ``RequestStatus.FINISHED_ERROR``,
an output with ``finish_reason`` ``error`` sent to its client (the OpenAI server answers
500, ``LLM.generate`` returns ``finish_reason == "error"``), and one log line naming
``KVP534`` and the request. The queue empties, the loop idles; the next requests are served
again from the grant, or from the group once it can be reached.

Only the head of the waiting queue is finished per step: vLLM's own decision (it scheduled
nothing with nothing running) is the evidence, and the request behind may fit.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from kvplan.schemas.errors import Code, error

if TYPE_CHECKING:
    from kvplan.integrations.vllm.elastic._scheduler import SchedulerSide

logger = logging.getLogger("vllm.kvplan")

GRACE_SECONDS = 2.0
"""How long the group's accounting must have been failing before a request that cannot start
is finished with an error (one more look at the group: ``GROUP_RETRY_SECONDS``)."""


def pick(scheduler: Any, side: SchedulerSide, output: Any) -> list[str]:
    """The requests of the step just scheduled (``output``) that the engine cannot serve: the
    head of the waiting queue when nothing is running, nothing was scheduled, and the group's
    accounting has been failing for :data:`GRACE_SECONDS`. Empty otherwise (the common case:
    two attribute reads)."""
    if not side.group_failed or getattr(scheduler, "running", None):
        return []
    if time.monotonic() - side.group_failed_at < GRACE_SECONDS:
        return []
    if int(getattr(output, "total_num_scheduled_tokens", 1) or 0) != 0:
        return []
    waiting = getattr(scheduler, "waiting", None)
    if not waiting:
        return []
    head = waiting.peek_request()
    if str(getattr(head, "status", "")) not in ("WAITING", "PREEMPTED"):
        return []  # waiting for something else (a grammar, remote KV): not kvplan's to judge
    return [str(head.request_id)]


def finish(scheduler: Any, side: SchedulerSide, request_ids: list[str], outputs: Any) -> Any:
    """Finish ``request_ids`` with vLLM's error status and add their last outputs to
    ``outputs`` (what ``update_from_output`` returns: client index -> ``EngineCoreOutputs``),
    logging ``KVP534`` for each. Returns ``outputs``."""
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
    from vllm.v1.request import RequestStatus

    finished = scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ERROR)
    for request in finished:
        side.unservable += 1
        diagnostic = error(
            Code.ELASTIC_REQUEST_UNSERVABLE,
            "KVPLAN_GROUP",
            f"request {request.request_id} ({request.num_tokens} tokens) cannot start: the "
            "group's accounting failed, so this engine maps no new memory, and what it has "
            f"mapped ({side.ledger.mapped_bytes} bytes) holds no room for it with nothing "
            "else running; the request is finished with an error instead of waiting.",
            "fix the group directory (`kvplan doctor`, docs/elastic.md); the engine maps again "
            "once the group can be reached",
        )
        logger.error("kvplan: %s", diagnostic.render())
        client = int(getattr(request, "client_index", 0) or 0)
        last = EngineCoreOutput(
            request_id=request.request_id, new_token_ids=[], finish_reason=FinishReason.ERROR
        )
        found = outputs.get(client)
        if found is None:
            outputs[client] = EngineCoreOutputs(outputs=[last])
        else:
            found.outputs.append(last)
    return outputs
