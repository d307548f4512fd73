"""The record of one agent-to-agent flow (a ``sessions_send`` and what follows it).

One hash per flow (``Keyspace.flow``). ``status`` is ``running`` while the run of round
``turn`` executes (turn 0 is the target's primary run; ``run:<n>`` holds each round's run
id, ``round:<n>`` its outcome), ``announcing`` from the end of the loop until the announce
run's reply is judged, then ``done``. Every step advances the flow with a compare-and-set
on (status, turn), so a duplicated or redelivered step finds the flow moved on and does
nothing. Active flows are kept for twice the run retention, ended ones for the retention.
The gateway methods ``flows.get`` and ``flows.list`` read them as a user sees them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from switchboard.shared.delivery import Target, get_delivery
from switchboard.shared.errors import NotFound
from switchboard.shared.flows.steps import read_hash
from switchboard.shared.gateway.resolve import resolve_session_ref
from switchboard.shared.services import Services
from switchboard.shared.store import codec
from switchboard.shared.store.runs import LinkAdvance, LinkRecord, now_ms

# The announce outcome counted for an announce status ("delivering": handed to delivery).
_ANNOUNCE_OUTCOMES = {"delivering": "delivered"}
# A session's flows index drops its members past the keep time on the writes of flows
# whose (random) id ends so, one in 16: an index holds about 16 more expired ids than it
# would trimmed on every write (readers skip them), for two commands fewer per send.
_TRIM_ON = "0"


@dataclass(frozen=True)
class Flow:
    """A flow as stored (decoded)."""

    flow_id: str
    fields: Mapping[str, str]

    def get(self, name: str) -> str | None:
        """A text field, None when absent or empty."""
        return self.fields.get(name) or None

    @property
    def status(self) -> str:
        """running | announcing | done."""
        return self.fields.get("status", "")

    @property
    def turn(self) -> int:
        """The round whose run the flow waits for (0 = the primary run)."""
        return int(self.fields.get("turn") or 0)

    @property
    def max_turns(self) -> int:
        """``session.agentToAgent.maxPingPongTurns`` when the flow started."""
        return int(self.fields.get("maxTurns") or 0)

    @property
    def requester_key(self) -> str | None:
        """The requester's canonical session key (None when the send had no session)."""
        return self.get("requesterKey")

    @property
    def target_key(self) -> str:
        """The target's canonical session key."""
        return self.fields.get("targetKey", "")

    def run_id(self, turn: int) -> str | None:
        """The run of round ``turn``, once started."""
        return self.get(f"run:{turn}")

    def with_fields(self, fields: Mapping[str, Any]) -> Flow:
        """The flow once ``fields`` are written over it (as `advance` stores them: a None
        value removes the field)."""
        merged = dict(self.fields)
        for name, value in _encode(fields).items():
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value
        return Flow(self.flow_id, merged)

    def announce_target(self) -> Target | None:
        """Where the announce goes, resolved when the primary run ended."""
        raw = codec.as_json(self.get("announceTarget"))
        if not isinstance(raw, dict) or not raw.get("channel"):
            return None
        return Target(
            channel=raw["channel"],
            to=raw.get("to"),
            account_id=raw.get("accountId"),
            thread_id=raw.get("threadId"),
        )


def retention_s(svc: Services) -> int:
    """How long an ended flow stays readable: the run retention."""
    return max(60, int(svc.config.runs.retention_hours * 3600))


def new_flow(
    svc: Services,
    *,
    requester_key: str | None,
    requester_channel: str | None,
    target_key: str,
    target_display: str,
    message: str,
    max_turns: int,
    skip_reason: str | None,
) -> tuple[str, LinkRecord]:
    """A new flow waiting for the target's primary run, not yet written: its id, and the
    record its primary run's start writes in the same step (`LinkRecord`)."""
    flow_id = svc.store.ks.new_id_beside(target_key)  # the target's run starts with it
    now = now_ms()
    fields = {
        "flowId": flow_id,
        "status": "running",
        "turn": 0,
        "requesterKey": requester_key,
        "requesterChannel": requester_channel,
        "targetKey": target_key,
        "targetDisplay": target_display,
        "message": message,
        "maxTurns": max_turns,
        "skipReason": skip_reason,
        "createdAt": now,
        "updatedAt": now,
    }
    keep_s = 2 * retention_s(svc)
    sessions = sorted({key for key in (target_key, requester_key) if key})
    return flow_id, LinkRecord(
        fields={k: v for k, v in _encode(fields).items() if v is not None},
        ttl_s=keep_s,
        indexes=tuple(svc.store.ks.session_flows(str(key)) for key in sessions),
        member=flow_id,
        score=now,
        trim_to=now - keep_s * 1000 if flow_id.endswith(_TRIM_ON) else 0,
    )


def create_flow(svc: Services, **flow: Any) -> str:
    """Record a new flow (as `new_flow` makes it) on its own; returns its id."""
    flow_id, record = new_flow(svc, **flow)
    # The link seam writes it exactly as a primary run's start does (one writer).
    svc.store.runs.write_link_record(svc.store.ks.flow(flow_id), record)
    return flow_id


def load_flow(svc: Services, flow_id: str) -> Flow | None:
    """The stored flow, or None when unknown or expired (in a step: `steps.read_hash`)."""
    fields = read_hash(svc, svc.store.ks.flow(flow_id))
    return Flow(flow_id, fields) if fields else None


def advancing(
    svc: Services, flow: Flow, fields: Mapping[str, Any], *, expect_turn: bool = True
) -> LinkAdvance:
    """The compare-and-set `advance` makes, for the step that records the run a flow step
    starts to make it (`RunRequest.link_advance`): one round trip for both, and the flow
    never moves on without that run. An ended flow is kept for the retention, an active
    one twice that."""
    final = fields.get("status") == "done"
    return LinkAdvance(
        status=flow.status,
        turn=str(flow.turn) if expect_turn else "",
        fields={**fields, "updatedAt": now_ms()},
        ttl_s=retention_s(svc) if final else 2 * retention_s(svc),
    )


def advance(
    svc: Services,
    flow: Flow,
    fields: Mapping[str, Any],
    *,
    expect_turn: bool = True,
) -> bool:
    """Write ``fields`` if the flow is still at the status (and turn) ``flow`` shows."""
    cas = advancing(svc, flow, fields, expect_turn=expect_turn)
    if not svc.store.flows.advance(flow.flow_id, cas):
        return False
    if fields.get("announceStatus"):  # the announce settled: counted once (metrics)
        outcome = str(fields["announceStatus"])
        svc.metrics.announced("a2a", _ANNOUNCE_OUTCOMES.get(outcome, outcome))
    return True


def record_once(svc: Services, flow_id: str, name: str, value: str) -> str:
    """Set a field unless it is set; returns the value that holds (first writer wins)."""
    return svc.store.flows.record_once(flow_id, name, value)


def _encode(fields: Mapping[str, Any]) -> dict[str, str | None]:
    return {k: codec.encode_value(v) for k, v in fields.items()}


def get_flow(svc: Services, flow_id: str) -> dict[str, Any] | None:
    """A flow as a user sees it: rounds, stop reason, announce and its delivery."""
    flow = load_flow(svc, flow_id)
    if flow is None:
        return None
    f = flow.fields
    out: dict[str, Any] = {
        "flowId": flow_id,
        "status": flow.status,
        "requesterSessionKey": flow.requester_key,
        "requesterChannel": flow.get("requesterChannel"),
        "targetSessionKey": flow.target_key,
        "message": flow.get("message"),
        "maxPingPongTurns": flow.max_turns,
        "turn": flow.turn,
        "pingPongSkipped": flow.get("skipReason"),
        "primaryRunId": flow.run_id(0),
        "rounds": _rounds(f),
        "roundOneReply": flow.get("roundOneReply"),
        "latestReply": flow.get("latestReply"),
        "stopReason": flow.get("stopReason"),
        "announce": _announce(svc, flow),
        "createdAt": codec.as_int(f.get("createdAt")),
        "updatedAt": codec.as_int(f.get("updatedAt")),
        "endedAt": codec.as_int(f.get("endedAt")),
    }
    return {k: v for k, v in out.items() if v is not None}


def flows_for(svc: Services, session_key: str, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` flows a session requested or was sent, newest first."""
    ids = svc.store.flows.recent_ids(session_key, limit)
    return [flow for flow in (get_flow(svc, flow_id) for flow_id in ids) if flow is not None]


def flows_get_method(svc: Services, params: Mapping[str, Any]) -> dict[str, Any]:
    """Gateway `flows.get`: a reply-back flow's rounds and announce outcome."""
    flow = get_flow(svc, params["flowId"])
    if flow is None:
        raise NotFound(f"unknown flowId: {params['flowId']}", field="flowId")
    return flow


def flows_list_method(svc: Services, params: Mapping[str, Any]) -> dict[str, Any]:
    """Gateway `flows.list`: the newest reply-back flows a session requested or was sent."""
    key = resolve_session_ref(svc, params.get("sessionKey"))
    flows = flows_for(svc, key, limit=int(params.get("limit") or 20))
    return {"sessionKey": key, "count": len(flows), "flows": flows}


def _rounds(fields: Mapping[str, str]) -> list[dict[str, Any]]:
    rounds = [codec.as_json(v) for k, v in fields.items() if k.startswith("round:")]
    return sorted((r for r in rounds if isinstance(r, dict)), key=lambda r: int(r["turn"]))


def _announce(svc: Services, flow: Flow) -> dict[str, Any]:
    target = codec.as_json(flow.get("announceTarget"))
    out: dict[str, Any] = {
        "status": flow.get("announceStatus") or "pending",
        "runId": flow.get("announceRunId"),
        "reply": flow.get("announceReply"),
        "error": flow.get("announceError"),
        "target": target,
        "deliveryId": flow.get("deliveryId"),
    }
    delivery_id = flow.get("deliveryId")
    delivery = get_delivery(svc, delivery_id) if delivery_id else None
    if delivery is not None:
        out["delivery"] = delivery
        out["status"] = delivery.get("status")
    return {k: v for k, v in out.items() if v is not None}
