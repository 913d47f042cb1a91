"""Leader-topic records: heartbeats (who sent it, its sequence number, when) and release hints.

Both are encoded as key = member id (UTF-8) and value = a small JSON object, so a reader can
skip other members' records by key and a person can read the topic with any console consumer.
A release hint (``{"neli":1,"hint":"released",...}``) says "the member that led this partition
has left the group": followers that read it ask the coordinator for their assignment at once.
It is never evidence of anything (see ``docs/protocol.md``, "Release hints").
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["Heartbeat", "ReleaseHint", "decode_heartbeat", "decode_hint"]

_FORMAT = 1


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

    def encode(self) -> tuple[bytes, bytes]:
        """Return the record's (key, value)."""
        value = json.dumps(
            {"neli": _FORMAT, "member": self.member, "seq": self.seq,
             "sent_at": self.sent_at, "sent_wall": self.sent_wall},
            separators=(",", ":"),
        )
        return self.member.encode("utf-8"), value.encode("utf-8")


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
                         sent_wall=float(data["sent_wall"]))
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

    def encode(self) -> tuple[bytes, bytes]:
        """Return the record's (key, value)."""
        value = json.dumps({"neli": _FORMAT, "hint": _RELEASED, "member": self.member,
                            "sent_wall": self.sent_wall}, separators=(",", ":"))
        return self.member.encode("utf-8"), value.encode("utf-8")


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
        return ReleaseHint(member=data["member"], sent_wall=float(data.get("sent_wall", 0.0)))
    except (ValueError, TypeError):
        return None
