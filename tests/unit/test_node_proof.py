"""A node's registration proof (workflows/node/proof.py) as the node workflow checks it
(workflows/node/rules.py): signed by the key the node is pinned to, fresh, and taken once."""

import pytest

from workflows.contracts import NodeInventory, NodeRecord, NodeRegistration, NodeView
from workflows.engine_keys import node_secret
from workflows.node.proof import CLOCK_SKEW_MS, identity_key, signed_registration
from workflows.node.rules import check_registration, view_of

SECRET = node_secret(b"m" * 32, "gpu-01")
OTHER = node_secret(b"m" * 32, "gpu-02")
NOW = 1_800_000_000_000


def reg(boot_id: str = "boot-1", machine_id: str = "machine-a") -> NodeRegistration:
    inventory = NodeInventory(name="gpu-01", machine_id=machine_id, cpu_cores=8)
    return NodeRegistration(inventory=inventory, boot_id=boot_id)


def signed(at: int = NOW, secret: bytes = SECRET, **fields: str) -> NodeRegistration:
    return signed_registration(reg(**fields), secret, at)


def pinned(identity: str = "", last: int = 0) -> NodeView:
    record = NodeRecord(inventory=NodeInventory(name="gpu-01"))
    return NodeView(record=record, identity=identity, last_signed_at_ms=last)


def check(r: NodeRegistration, view: NodeView | None, now: int = NOW) -> None:
    check_registration("gpu-01", r, view, live=False, now_ms=now)


def test_the_identity_is_a_public_key_the_same_for_every_holder_of_the_token() -> None:
    assert identity_key(SECRET) == identity_key(node_secret(b"m" * 32, "gpu-01"))
    assert identity_key(SECRET) != identity_key(OTHER)
    assert SECRET.hex() not in identity_key(SECRET)
    first = signed()
    check(first, None)
    assert first.identity == identity_key(SECRET)


def test_a_registration_copied_from_history_is_refused() -> None:
    first = signed()
    check(first, pinned(identity_key(SECRET)))
    view = view_of(pinned(identity_key(SECRET)), first)
    assert view.last_signed_at_ms == NOW
    with pytest.raises(ValueError, match="a copy of one already taken"):
        check(first.model_copy(), view, now=NOW + 1000)
    check(signed(at=NOW + 1000, boot_id="boot-2"), view, now=NOW + 1000)  # signed anew: taken


def test_a_copy_with_anything_changed_does_not_verify() -> None:
    first = signed()
    for change in (
        {"signed_at_ms": NOW + 1},
        {"boot_id": "boot-9"},
        {"inventory": NodeInventory(name="gpu-01", machine_id="machine-b")},
        {"proof": "00" * 64},
    ):
        with pytest.raises(ValueError, match="its proof is not signed by the key it names"):
            check(first.model_copy(update=change), pinned(identity_key(SECRET)))


def test_another_tokens_key_is_refused() -> None:
    with pytest.raises(ValueError, match="was joined with another token"):
        check(signed(secret=OTHER), pinned(identity_key(SECRET)))


@pytest.mark.parametrize(
    ("offset", "word"), [(CLOCK_SKEW_MS + 1000, "ahead of"), (-CLOCK_SKEW_MS - 1000, "behind")]
)
def test_a_registration_signed_far_from_the_control_planes_clock_is_refused(
    offset: int, word: str
) -> None:
    with pytest.raises(ValueError, match=f"signed 301 s {word} the control plane's clock"):
        check(signed(at=NOW + offset), None)
    check(signed(at=NOW + offset // 2), None)


def test_a_node_pinned_to_a_key_refuses_an_unsigned_registration() -> None:
    legacy = reg().model_copy(update={"identity": "0123456789abcdef0123456789abcdef"})
    with pytest.raises(ValueError, match="takes signed registrations only"):
        check(legacy, pinned(identity_key(SECRET)))
    with pytest.raises(ValueError, match="takes signed registrations only"):
        check(reg(), pinned(identity_key(SECRET)))


def test_a_node_pinned_before_keys_takes_its_old_identity_then_is_pinned_to_the_key() -> None:
    old = "0123456789abcdef0123456789abcdef"  # sha256 of the secret, as agents sent before
    check(reg().model_copy(update={"identity": old}), pinned(old))
    upgraded = view_of(pinned(old), signed())
    check(signed(), pinned(old))
    assert upgraded.identity == identity_key(SECRET)
    with pytest.raises(ValueError, match="takes signed registrations only"):
        check(reg().model_copy(update={"identity": old}), upgraded)
