"""The liveness reader reads groups through the Kafka seam: a fake admin drives every verdict.

No broker: the fake plays the group coordinator (the broker tests beside this file show the
same verdicts against a real one).
"""

from __future__ import annotations

import json

import pytest

from neli_orchestrate.core.kafka import CommittedOffset, GroupDescription, GroupMember
from neli_orchestrate.errors import AuthorizationError, KafkaUnavailableError
from neli_orchestrate.liveness import Liveness, LivenessReader, liveness_group

NS = "acme"


class FakeGroupAdmin:
    """The read-only group calls of :class:`~neli_orchestrate.core.kafka.LeaderTopicAdmin`."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupDescription] = {}
        self.offsets: dict[str, list[CommittedOffset]] = {}
        self.denied = False

    def announce(self, deployment: str, *, members: list[str], state: str = "STABLE",
                 since: float = 100.0, timeout: float = 10.0) -> None:
        group = liveness_group(NS, deployment)
        self.groups[group] = GroupDescription(
            group_id=group, state=state,
            members=tuple(GroupMember(member_id=f"m{i}", client_id=c)
                          for i, c in enumerate(members)))
        metadata = json.dumps({"deployment": deployment, "since": since, "timeout": timeout})
        self.offsets[group] = [CommittedOffset(topic=f"{NS}.neli", partition=0, offset=0,
                                               metadata=metadata)]

    def list_groups(self, timeout: float) -> list[str]:
        return [*self.groups, f"{NS}.daily", "other.deployment.x"]

    def describe_group(self, group_id: str, timeout: float) -> GroupDescription | None:
        if self.denied:
            raise AuthorizationError(f"describing consumer group {group_id!r} was denied")
        return self.groups.get(group_id)

    def group_offsets(self, group_id: str, timeout: float) -> list[CommittedOffset]:
        return self.offsets.get(group_id, [])


def test_members_mean_alive_since_the_oldest_announcer() -> None:
    admin = FakeGroupAdmin()
    admin.announce("us-east-1", members=["neli-liveness/2000", "neli-liveness/1500", "other"])
    seen = LivenessReader(admin, NS).read("us-east-1", details=True)
    assert (seen.state, seen.members, seen.since, seen.timeout) == (Liveness.ALIVE, 3, 1.5, 10.0)


def test_an_empty_group_means_gone_with_the_announced_start_and_timeout() -> None:
    admin = FakeGroupAdmin()
    admin.announce("us-east-1", members=[], state="EMPTY", since=42.0, timeout=30.0)
    seen = LivenessReader(admin, NS).read("us-east-1", details=True)
    assert (seen.state, seen.since, seen.timeout) == (Liveness.GONE, 42.0, 30.0)
    assert seen.gone


def test_no_group_or_a_dead_one_is_unknown_never_gone() -> None:
    admin = FakeGroupAdmin()
    admin.announce("eu-west-1", members=[], state="DEAD")
    reader = LivenessReader(admin, NS)
    assert reader.read("us-east-1").state is Liveness.UNKNOWN
    assert reader.read("us-east-1").detail == "never announced"
    assert reader.read("eu-west-1").state is Liveness.UNKNOWN


def test_read_all_lists_only_the_namespaces_liveness_groups_by_name() -> None:
    admin = FakeGroupAdmin()
    admin.announce("us-east-1", members=["neli-liveness/1000"])
    admin.announce("ap-south-1", members=[], state="EMPTY")
    found = LivenessReader(admin, NS).read_all()
    assert [(d.deployment, d.state) for d in found] == [
        ("ap-south-1", Liveness.GONE), ("us-east-1", Liveness.ALIVE)]


def test_a_denied_or_failed_read_is_kafka_unavailable_never_a_verdict() -> None:
    admin = FakeGroupAdmin()
    admin.announce("us-east-1", members=[], state="EMPTY")
    admin.denied = True
    with pytest.raises(KafkaUnavailableError, match="cannot describe liveness group"):
        LivenessReader(admin, NS).read("us-east-1")
