"""Timing and fault parameters of the simulation, and the timing assumptions they must meet."""

from __future__ import annotations

from dataclasses import dataclass

from neli_orchestrate.errors import ConfigError

#: Mutations: deliberately broken variants of the protocol, to prove the checker can fail.
MUTATIONS: dict[str, str] = {
    "ignore_completed": "decide() runs a COMPLETED run key again (TAKE_OVER instead of SKIP_DONE)",
    "run_on_wait": "decide() takes over another deployment's live claim instead of WAIT",
    "no_fencing": "begin() skips init_transactions(): earlier leaders' producers stay valid",
    "token_reuse": "a new claim reuses the latest record's token instead of Replay.next_token",
    "no_claim_check": "the executor runs without check_claim() (even a superseded claim)",
    "no_membership_proof": "a member's lease is renewed by its own heartbeats alone (no proof"
    " that the group still counts it as a member)",
    "no_self_fence": "a member ignores missing heartbeats (leads while it thinks it is assigned)",
    "hint_grants": "a release hint is taken as a grant: the reader leads without an assignment",
    "superseded_by_own_claim": "an executor try refuses to run when its own deployment's later"
    " claim (an earlier try's re-claim) is the latest record, instead of deciding again",
    "fence_before_start_dropped": "a fence landing between the claim check and the start of"
    " the work is dropped: the work starts and runs unwatched",
    "sink_hwm_on_publish": "the token-checked sink raises its high-water mark only when a token"
    " publishes, not when a newer claim's job stages",
    "unread_unreadable": "a try decides from the older record (Replay.records) when the run"
    " key's newest ledger record cannot be read, instead of refusing (Replay.latest)",
    "stale_replay_cache": "a host's replay checkpoint is trusted as the whole ledger: the"
    " records written since it was taken are not read",
    "invalid_end_offset": "a replay takes the end offset -1001 that a ledger partition answers"
    " while its leader changes as the partition's end (issue 31): it reads nothing, and"
    " issues token 0 or refuses the claim as if the topic were recreated",
    "wait_fails_try": "an Airflow executor try that finds another deployment's live claim"
    " (WAIT) or cannot lead in time fails and uses a try, instead of waiting as the gate does",
    "liveness_takeover_no_token": "a take-over on a GONE liveness verdict (right or wrong: the"
    " deployment may be alive) reuses the superseded claim's token instead of a new one",
    # issue 31: the ride-through of a broker's stall without its bound (protocol.md, 8a)
    "unbounded_ride_through": "a leader whose evidence stops keeps leading while nothing"
    " disproves it, with no bound from its last proof of membership (a stall taken for proof)",
}


@dataclass(frozen=True)
class SimConfig:
    """Simulated timings in milliseconds. Defaults satisfy the timing assumptions."""

    #: One deployment is "a single surviving region" from the start.
    deployments: tuple[int, int] = (1, 3)
    roles: tuple[int, int] = (1, 2)
    run_keys_per_role: tuple[int, int] = (1, 3)
    #: Ledger partitions to choose from (1: all roles share one partition and one last
    #: stable offset, so one role's open transaction blocks the others' replays).
    ledger_partitions: tuple[int, ...] = (1, 2)

    min_delay: int = 1
    max_delay: int = 15
    request_timeout: int = 500

    session_timeout: int = 1000
    session_interval: int = 200
    heartbeat_timeout: int = 500
    #: A leader's lease after its newest acknowledged session heartbeat while its evidence
    #: stalls (docs/internals/protocol.md, 8a): the broker resets the session when it receives
    #: the heartbeat, so anything below session_timeout is safe for S1; the core also leaves
    #: the work its stop budget, (session - heartbeat_timeout) / 2: 1000 - 250 = 750. At or
    #: below heartbeat_timeout (0 included) there is no ride-through, as in the core.
    ride_through: int = 750
    #: Fraction of faulty schedules with a broker stall: for ``broker_stall`` ms the group
    #: coordinator still processes heartbeats (sessions are renewed) but answers nothing, and
    #: NELI heartbeats are written but not read back (a frozen high watermark).
    broker_stall_fraction: float = 0.3
    broker_stall: tuple[int, int] = (100, 1200)
    rebalance_timeout: int = 2500
    barrier_deadline: int = 1500
    transaction_timeout: int = 3000
    acquire_timeout: int = 4000

    handoff_timeout: int = 8000
    #: Deployment liveness (neli_orchestrate.liveness): a deployment whose announcer's
    #: heartbeats have not reached the broker for ``liveness_timeout`` is GONE.
    liveness_timeout: int = 1000
    liveness_interval: int = 200
    #: Fraction of deployments that announce liveness (the others: an older version, UNKNOWN).
    liveness_fraction: float = 0.85
    wait_poll: int = 1000
    retry_delay: tuple[int, int] = (200, 800)
    #: Delay before an operator clears (re-runs) a failed DAG run, when one does.
    clear_delay: tuple[int, int] = (1000, 5000)
    scheduler_delay: tuple[int, int] = (10, 300)
    work_duration: tuple[int, int] = (100, 1500)
    max_attempts: int = 3
    #: Bound on each deployment's wall-clock offset from true time (ms).
    clock_error: int = 200

    fault_free_fraction: float = 0.25
    #: Faulty schedules where a deployment running a newer neli-orchestrate completes one run
    #: key, its records in schema v2, unreadable to this version (rare: the run key is dead
    #: for the others, which must refuse it).
    newer_writer_fraction: float = 0.02
    fault_horizon: int = 10_000
    time_limit: int = 150_000

    mutation: str | None = None
    trace: bool = True
    #: Refuse timings that break the assumptions below (tests turn it off to show they matter).
    check_assumptions: bool = True

    def __post_init__(self) -> None:
        if self.mutation is not None and self.mutation not in MUTATIONS:
            raise ConfigError(
                f"unknown mutation {self.mutation!r}; choose from {', '.join(MUTATIONS)}"
            )
        if not self.check_assumptions:
            return
        delay = 3 * self.max_delay
        if not self.heartbeat_timeout < self.session_timeout:
            raise ConfigError(
                f"timing assumption broken: heartbeat_timeout = {self.heartbeat_timeout} must be"
                f" below session_timeout = {self.session_timeout} (a leader's lease, renewed by"
                " proofs of membership, must end before the coordinator can expire it)"
            )
        barrier = self.barrier_deadline + self.session_interval + self.heartbeat_timeout + delay
        if not barrier < self.rebalance_timeout:
            raise ConfigError(
                "timing assumption broken: barrier_deadline + session_interval +"
                f" heartbeat_timeout + 3*max_delay = {barrier} must be below rebalance_timeout"
                f" = {self.rebalance_timeout} (the revoke barrier must end before the"
                " coordinator kicks the member)"
            )
        if not self.ride_through < self.session_timeout:
            raise ConfigError(
                f"timing assumption broken: ride_through = {self.ride_through} must be below"
                f" session_timeout = {self.session_timeout} (the extended lease must end"
                " before the coordinator can expire the member)"
            )
        if not self.session_interval + 2 * self.max_delay < self.heartbeat_timeout:
            raise ConfigError(
                "heartbeat_timeout must exceed session_interval (the pulse) + 2*max_delay,"
                " or leaders flap"
            )
        if not self.liveness_interval + 2 * self.max_delay < self.liveness_timeout:
            raise ConfigError(
                "liveness_timeout must exceed liveness_interval + 2*max_delay, or live"
                " deployments are declared gone without any fault"
            )
        if not 0 <= self.fault_free_fraction <= 1:
            raise ConfigError("fault_free_fraction must be within [0, 1]")
        if not 0 <= self.newer_writer_fraction <= 1:
            raise ConfigError("newer_writer_fraction must be within [0, 1]")
