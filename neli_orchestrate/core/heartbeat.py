"""Leader-topic records: heartbeats (who sent it, its sequence number, when) and release hints.

Both are encoded as key = member id (UTF-8) and value = a small JSON object, so a reader can
skip other members' records by key and a person can read the topic with any console consumer.
Both name the member's group (``"group"``): many groups share one leader-topic partition (a
``Singleton`` contends for every role through partition 0 of ``<namespace>.neli``), and a
follower must take only its own group's hints and heartbeats as news of its leader
(:func:`group_tag`). Records without the field (older writers) count for every group.
A release hint (``{"neli":1,"hint":"released",...}``) says "the member that led this partition
has left the group": followers that read it ask the coordinator for their assignment at once.
It is never evidence of anything (see ``docs/internals/protocol.md``, "Release hints").
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["Heartbeat", "ReleaseHint", "decode_heartbeat", "decode_hint", "group_tag",
           "of_group"]

_FORMAT = 1


def _encode(key: str, group: str | None, **fields: object) -> tuple[bytes, bytes]:
    """(key, value) of a leader-topic record: key = the member id, value = compact JSON."""
    body: dict[str, object] = {"neli": _FORMAT, **fields}
    if group is not None:
        body["group"] = group
    return key.encode("utf-8"), json.dumps(body, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True)
class Heartbeat:
    """A member's heartbeat on the leader topic.

    ``sent_at`` is the sender's monotonic clock, meaningful only to the sender (which is the
    only member that counts the heartbeat in Fast NELI); ``sent_wall`` is for people reading
    the topic.
    """

    member: str
    seq: int
    sent_at: float
    sent_wall: float
    group: str | None = None

    def encode(self) -> tuple[bytes, bytes]:
        """Return the record's (key, value)."""
        return _encode(self.member, self.group, member=self.member, seq=self.seq,
                       sent_at=self.sent_at, sent_wall=self.sent_wall)


def decode_heartbeat(key: bytes | None, value: bytes | None) -> Heartbeat | None:
    """Parse a leader-topic record; ``None`` if it is not a heartbeat of this format."""
    if value is None:
        return None
    try:
        data = json.loads(value)
        if not isinstance(data, dict) or data.get("neli") != _FORMAT or "hint" in data:
            return None
        member = data["member"]
        seq = data["seq"]
        if not isinstance(member, str) or isinstance(seq, bool) or not isinstance(seq, int):
            return None
        if key is not None and key != member.encode("utf-8"):
            return None  # key and body disagree: not a well-formed heartbeat
        return Heartbeat(member=member, seq=seq, sent_at=float(data["sent_at"]),
                         sent_wall=float(data["sent_wall"]), group=_group(data))
    except (ValueError, KeyError, TypeError):
        return None


_RELEASED = "released"


@dataclass(frozen=True)
class ReleaseHint:
    """A departing leader's note on its partition: "I left the group; ask for your assignment".

    Anyone can write one (nothing authenticates it), so a reader only uses it as a reason to
    contact the group coordinator sooner; it grants nothing.
    """

    member: str
    sent_wall: float
    group: str | None = None

    def encode(self) -> tuple[bytes, bytes]:
        """Return the record's (key, value)."""
        return _encode(self.member, self.group, hint=_RELEASED, member=self.member,
                       sent_wall=self.sent_wall)


def decode_hint(value: bytes | None) -> ReleaseHint | None:
    """Parse a leader-topic record; ``None`` if it is not a release hint."""
    # Heartbeats far outnumber hints: skip them without a JSON parse.
    if value is None or b'"hint"' not in value:
        return None
    try:
        data = json.loads(value)
        if not isinstance(data, dict) or data.get("neli") != _FORMAT \
                or data.get("hint") != _RELEASED or not isinstance(data.get("member"), str):
            return None
        return ReleaseHint(member=data["member"], sent_wall=float(data.get("sent_wall", 0.0)),
                           group=_group(data))
    except (ValueError, TypeError):
        return None


def _group(data: dict[str, object]) -> str | None:
    group = data.get("group")
    return group if isinstance(group, str) else None


_GROUP_FIELD = b'"group":'


def group_tag(group_id: str) -> bytes:
    """The bytes by which a record's value names ``group_id`` (what :func:`of_group` looks for)."""
    return _GROUP_FIELD + json.dumps(group_id).encode("utf-8")


def of_group(value: bytes | None, tag: bytes) -> bool:
    """Is this leader-topic record about the group of ``tag`` (:func:`group_tag`)?

    A substring test, no JSON parse: a follower sees every group's records on a shared
    partition, hundreds per second with many roles. Inside a JSON string a quote is escaped,
    so the tag cannot match a member name. A record without a group (an older writer) is
    taken as every group's.
    """
    if value is None:
        return False
    return tag in value or _GROUP_FIELD not in value
