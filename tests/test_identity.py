"""Identity: the key file, and a peer id that is exactly libp2p's."""

from __future__ import annotations

import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from node.identity import (
    _SMALL_ORDER,
    FIELD_PRIME,
    GROUP_ORDER,
    Identity,
    IdentityError,
    b58decode,
    b58encode,
    key_path,
    load_identity,
    new_identity,
    peer_id_from_public_key,
    point_problem,
    public_key_from_peer_id,
    signature_problem,
    verify_signature,
)

# The Ed25519 test vector of the libp2p peer-id spec (peer-ids.md, "Test vectors"): the private
# key protobuf 08 01 12 40 + seed + public key. The peer id is the one rust-libp2p derives.
SPEC_PRIVATE_PB = bytes.fromhex(
    "080112407e0830617c4a7de83925dfb2694556b12936c477a0e1feb2e148ec9da60fee7d"
    "1ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e"
)
SPEC_PUBLIC = bytes.fromhex("1ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e")
SPEC_PEER_ID = "12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pq"


def test_peer_id_matches_the_libp2p_spec_test_vector():
    me = Identity(SPEC_PRIVATE_PB[4:36])
    assert me.public_key == SPEC_PUBLIC
    assert me.peer_id == SPEC_PEER_ID
    assert me.to_libp2p_private_key() == SPEC_PRIVATE_PB


def test_peer_id_gives_back_its_public_key_and_refuses_other_ids():
    assert public_key_from_peer_id(SPEC_PEER_ID) == SPEC_PUBLIC
    with pytest.raises(IdentityError):
        public_key_from_peer_id("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")  # an RSA id
    with pytest.raises(IdentityError):
        public_key_from_peer_id("12D3KooW0OIl")  # not base58


def test_base58_keeps_leading_zero_bytes():
    for data in (b"", b"\0", b"\0\0\x01", b"\xff" * 40):
        assert b58decode(b58encode(data)) == data


def test_key_is_created_on_first_use_with_mode_0600_and_reloads_identically(tmp_path):
    first = load_identity(tmp_path)
    assert stat.S_IMODE(key_path(tmp_path).stat().st_mode) == 0o600
    assert key_path(tmp_path).read_bytes() == first.to_libp2p_private_key()
    assert load_identity(tmp_path).peer_id == first.peer_id
    assert first.peer_id.startswith("12D3KooW")


def test_new_key_refuses_to_overwrite_unless_forced(tmp_path):
    old = new_identity(tmp_path)
    with pytest.raises(IdentityError, match="--force"):
        new_identity(tmp_path)
    assert load_identity(tmp_path) == old
    new = new_identity(tmp_path, force=True)
    assert new != old and load_identity(tmp_path) == new


def test_a_key_file_of_the_wrong_shape_is_a_clear_error(tmp_path):
    key_path(tmp_path).write_bytes(b"not a key")
    with pytest.raises(IdentityError, match="not an Ed25519 key file"):
        load_identity(tmp_path)
    with pytest.raises(IdentityError, match="no key"):
        load_identity(tmp_path / "empty", create=False)


def test_key_files_written_by_other_libp2p_tools_load(tmp_path):
    seed = SPEC_PRIVATE_PB[4:36]
    for content in (SPEC_PRIVATE_PB, bytes([8, 1, 0x12, 32]) + seed, seed):
        key_path(tmp_path).write_bytes(content)
        assert load_identity(tmp_path).peer_id == SPEC_PEER_ID
    tampered = SPEC_PRIVATE_PB[:-1] + bytes([SPEC_PRIVATE_PB[-1] ^ 1])
    key_path(tmp_path).write_bytes(tampered)
    with pytest.raises(IdentityError, match="does not match"):
        load_identity(tmp_path)


def test_signatures_verify_only_for_the_signer_and_the_exact_message():
    me, other = Identity(bytes(32)), Identity(bytes([1]) * 32)
    sig = me.sign(b"fact")
    assert verify_signature(me.public_key, sig, b"fact")
    assert not verify_signature(me.public_key, sig, b"fact!")
    assert not verify_signature(other.public_key, sig, b"fact")
    assert not verify_signature(b"short", sig, b"fact")
    assert peer_id_from_public_key(me.public_key) == me.peer_id
    assert "seed" not in repr(me) and me.seed.hex() not in repr(me)


# ---------------------------------------------------------------- weak keys and signatures
# Curve arithmetic written out here, independent of the node's fixed list of weak points.
_D = -121665 * pow(121666, -1, FIELD_PRIME) % FIELD_PRIME


def _add(p: tuple[int, int], q: tuple[int, int]) -> tuple[int, int]:
    (x1, y1), (x2, y2), m = p, q, FIELD_PRIME
    t = _D * x1 * x2 * y1 * y2 % m
    return (
        (x1 * y2 + x2 * y1) * pow(1 + t, -1, m) % m,
        (y1 * y2 + x1 * x2) * pow(1 - t, -1, m) % m,
    )


def _times(k: int, p: tuple[int, int]) -> tuple[int, int]:
    out = (0, 1)
    while k:
        if k & 1:
            out = _add(out, p)
        p, k = _add(p, p), k >> 1
    return out


def _point(y: int) -> tuple[int, int] | None:
    m = FIELD_PRIME
    u = (y * y - 1) * pow(_D * y * y + 1, -1, m) % m
    x = pow(u, (m + 3) // 8, m)
    if x * x % m != u:
        x = x * pow(2, (m - 1) // 4, m) % m
    return (x, y) if x * x % m == u else None


def _encode(p: tuple[int, int]) -> bytes:
    return (p[1] | (p[0] & 1) << 255).to_bytes(32, "little")


def _eight_torsion() -> set[bytes]:
    """The points of order dividing 8: multiples of [L]P for a P whose torsion part has order 8."""
    y = 2
    while True:
        y += 1
        if (p := _point(y)) is None:
            continue
        torsion = _times(GROUP_ORDER, p)
        points = {_times(i, torsion) for i in range(8)}
        if len(points) == 8:
            return {_encode(q) for q in points}


def test_the_weak_point_list_is_the_eight_small_order_points_and_two_spellings_of_x_zero():
    torsion = _eight_torsion()
    assert torsion <= _SMALL_ORDER
    negative_zero = {
        bytes([1] + [0] * 30 + [0x80]),
        (FIELD_PRIME - 1 | 1 << 255).to_bytes(32, "little"),
    }
    assert _SMALL_ORDER - torsion == negative_zero
    assert all(point_problem(p) == "a point of small order" for p in _SMALL_ORDER)


def test_the_identity_key_with_r_identity_and_s_zero_verifies_nothing():
    identity = _encode((0, 1))
    sig = identity + bytes(32)
    for message in (b"a fact", b"any other fact"):
        # OpenSSL alone accepts it for every message: the check is ours to make.
        Ed25519PublicKey.from_public_bytes(identity).verify(sig, message)
        assert not verify_signature(identity, sig, message)
    assert signature_problem(sig) == "R is a point of small order"


def test_small_order_and_non_canonical_keys_and_signatures_are_refused():
    me = Identity(bytes([7]) * 32)
    sig = me.sign(b"fact")
    assert verify_signature(me.public_key, sig, b"fact") and signature_problem(sig) is None
    assert point_problem(me.public_key) is None
    for weak in _SMALL_ORDER:
        assert not verify_signature(weak, sig, b"fact")
        assert not verify_signature(me.public_key, weak + sig[32:], b"fact")
    # S + L is the same signature to a lax verifier: a second id for one fact.
    malleated = sig[:32] + (int.from_bytes(sig[32:], "little") + GROUP_ORDER).to_bytes(32, "little")
    assert signature_problem(malleated) == "S is not below the group order"
    assert not verify_signature(me.public_key, malleated, b"fact")
    # y >= p spells a point that has a shorter name (y - p); so does any key with y in [p, 2^255).
    for y in (FIELD_PRIME, FIELD_PRIME + 1, FIELD_PRIME + 18, (1 << 255) - 1):
        for sign in (0, 1 << 255):
            key = (y | sign).to_bytes(32, "little")
            assert point_problem(key) == "a non-canonical encoding (y >= 2^255 - 19)"
            assert not verify_signature(key, sig, b"fact")


def test_a_peer_id_of_a_weak_key_is_refused():
    weak = peer_id_from_public_key(_encode((0, 1)))
    with pytest.raises(IdentityError, match="weak Ed25519 key"):
        public_key_from_peer_id(weak)
