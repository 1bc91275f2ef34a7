"""How long a replica waits before it starts a crashed engine again. No Temporal here."""

from workflows.replica.rules import restart_backoff


def test_restart_backoff_doubles_and_caps() -> None:
    assert [restart_backoff(n).total_seconds() for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert restart_backoff(30).total_seconds() == 60
    # A crash loop that runs for days (the count only resets after a long run) stays capped.
    assert restart_backoff(10_000).total_seconds() == 60
