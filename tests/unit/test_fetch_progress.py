"""How `llmgw fetches` shows a node's fetch: the heartbeat read back, the bytes, a retry and an
agent from before the heartbeat carried numbers."""

from workers.fetch_progress import FetchStatus, fetch_row, progress_text, read_heartbeat
from workflows.contracts import ArtifactFetchView, FetchProgressReport

DIGEST = "sha256:" + "3f9a0c1d22e4" + "0" * 52


def view() -> ArtifactFetchView:
    return ArtifactFetchView(node="gpu-1", manifest=DIGEST, model="llama-8b")


def test_the_heartbeat_is_read_back_as_its_line_and_its_numbers() -> None:
    report = FetchProgressReport(done=5, total=10, current="model.gguf", note="fetching")
    line = "fetching (model.gguf): 0.00 of 0.00 GB (50%)"
    assert read_heartbeat([line, report.model_dump()]) == (line, report)
    # An agent from before the numbers heartbeats its line alone.
    assert read_heartbeat(["fetching: 1.20 of 4.00 GB (30%)"]) == (
        "fetching: 1.20 of 4.00 GB (30%)",
        None,
    )
    # Something that is not a report is no report, and no error.
    assert read_heartbeat([{"done": -1}]) == ("", None)


def test_progress_is_bytes_done_of_total() -> None:
    assert progress_text(FetchProgressReport(done=3 << 30, total=8 << 30)) == (
        "3.22 of 8.59 GB (38%)"
    )
    # Before the manifest is read the total is not known: nothing to show yet.
    assert progress_text(FetchProgressReport(note="reading the manifest")) == ""
    assert progress_text(None) == ""


def test_a_row_names_node_artifact_model_progress_and_what_it_does() -> None:
    report = FetchProgressReport(done=1 << 30, total=4 << 30, current="model.gguf", note="fetching")
    row = fetch_row(FetchStatus(workflow_id="fetch:x", view=view(), report=report))
    assert row == [
        "gpu-1",
        "sha256:3f9a0c1d22e4",
        "llama-8b",
        "fetching",
        "1.07 of 4.29 GB (25%)",
        "fetching (model.gguf)",
    ]


def test_a_retried_fetch_says_which_attempt_and_why_the_last_failed() -> None:
    report = FetchProgressReport(done=1, total=4, note="checking what was already downloaded")
    status = FetchStatus(
        workflow_id="fetch:x",
        view=view(),
        report=report,
        attempt=2,
        last_failure="activity Heartbeat timeout",
    )
    assert fetch_row(status)[-1] == (
        "checking what was already downloaded; attempt 2, the last failed: "
        "activity Heartbeat timeout"
    )


def test_an_older_agent_shows_its_line() -> None:
    status = FetchStatus(workflow_id="fetch:x", view=view(), line="fetching: 1.20 of 4.00 GB (30%)")
    assert fetch_row(status)[4:] == ["", "fetching: 1.20 of 4.00 GB (30%)"]
