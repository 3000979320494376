"""Identity: the key file, and a peer id that is exactly libp2p's."""

from __future__ import annotations

import stat

import pytest

from node.identity import (
    Identity,
    IdentityError,
    b58decode,
    b58encode,
    key_path,
    load_identity,
    new_identity,
    peer_id_from_public_key,
    public_key_from_peer_id,
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
