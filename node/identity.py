"""A node's identity: one Ed25519 key that signs facts and names the node on the network.

The peer id is exactly libp2p's peer id of the same key, so the gossip layer and the ledger agree
on who a peer is. The key file is created on first use, mode 0600, and never overwritten silently.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from node.errors import SwarmError

KEY_FILE = "identity.key"  # inside the node's home
SEED_SIZE = 32  # raw Ed25519 private seed
PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64

# libp2p's protobuf PublicKey/PrivateKey {1: KeyType = Ed25519 (1), 2: Data}, field headers only.
_PB_ED25519_PUBLIC = bytes([0x08, 0x01, 0x12, PUBLIC_KEY_SIZE])
_PB_ED25519_PRIVATE = bytes([0x08, 0x01, 0x12, SEED_SIZE + PUBLIC_KEY_SIZE])  # seed + public key
_PB_ED25519_SEED_ONLY = bytes([0x08, 0x01, 0x12, SEED_SIZE])  # what some libraries write
_IDENTITY_MULTIHASH = 0x00  # keys whose protobuf is <= 42 bytes are inlined, not hashed

# Ed25519's group: points y < FIELD_PRIME (a sign bit for x on top), scalars below GROUP_ORDER.
FIELD_PRIME = 2**255 - 19
GROUP_ORDER = 2**252 + 27742317777372353535851937790883648493
# The eight points of small order (1, 2, 4 and 8), as 32-byte encodings, plus the two that spell
# x = 0 with the sign bit set (the identity and the point of order 2 once more). A key or a
# signature's R among them lets one signature verify for many messages (the identity key with
# R = identity and S = 0 verifies for all); `cryptography` (OpenSSL) accepts them.
_SMALL_ORDER = frozenset(bytes.fromhex(h) for h in (
    "0100000000000000000000000000000000000000000000000000000000000000",  # identity
    "0100000000000000000000000000000000000000000000000000000000000080",  # identity, x = -0
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",  # (0, -1), order 2
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",  # the same, x = -0
    "0000000000000000000000000000000000000000000000000000000000000000",  # (+-sqrt(-1), 0), 4
    "0000000000000000000000000000000000000000000000000000000000000080",
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",  # order 8
    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
    "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
))  # fmt: skip

_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58_ALPHABET)}


class IdentityError(SwarmError):
    """A key file that is missing, unreadable or not an Ed25519 key, or a peer id that is not one."""


def b58encode(data: bytes) -> str:
    """Base58btc (Bitcoin alphabet), as multibase and libp2p use it."""
    number = int.from_bytes(data, "big")
    out = []
    while number:
        number, digit = divmod(number, 58)
        out.append(_B58_ALPHABET[digit])
    leading_zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * leading_zeros + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    """Inverse of `b58encode`; raises IdentityError on a character outside the alphabet."""
    number = 0
    for char in text:
        if char not in _B58_INDEX:
            raise IdentityError(f"not base58: {char!r} in {text!r}")
        number = number * 58 + _B58_INDEX[char]
    body = number.to_bytes((number.bit_length() + 7) // 8, "big")
    leading_ones = len(text) - len(text.lstrip("1"))
    return b"\0" * leading_ones + body


@functools.lru_cache(maxsize=4096)  # every stored fact asks; base58 is slow in Python
def peer_id_from_public_key(public_key: bytes) -> str:
    """libp2p peer id of an Ed25519 public key: base58 of the identity multihash of its protobuf."""
    if len(public_key) != PUBLIC_KEY_SIZE:
        raise IdentityError(f"an Ed25519 public key has 32 bytes, not {len(public_key)}")
    encoded = _PB_ED25519_PUBLIC + public_key
    return b58encode(bytes([_IDENTITY_MULTIHASH, len(encoded)]) + encoded)


def public_key_from_peer_id(peer_id: str) -> bytes:
    """The Ed25519 public key inside a peer id (`12D3KooW...`); IdentityError if there is none."""
    raw = b58decode(peer_id)
    prefix = bytes([_IDENTITY_MULTIHASH, len(_PB_ED25519_PUBLIC) + PUBLIC_KEY_SIZE])
    prefix += _PB_ED25519_PUBLIC
    if len(raw) != len(prefix) + PUBLIC_KEY_SIZE or not raw.startswith(prefix):
        raise IdentityError(f"{peer_id!r} is not the peer id of an Ed25519 key")
    key = raw[len(prefix) :]
    if problem := point_problem(key):
        raise IdentityError(f"{peer_id!r} names a weak Ed25519 key: {problem}")
    return key


def point_problem(encoding: bytes) -> str | None:
    """Why a 32-byte Ed25519 point encoding (a public key, a signature's R) must not be trusted:
    y not below the field prime (a second spelling of another point), or a point of small
    order; None for a sound one."""
    if not isinstance(encoding, bytes) or len(encoding) != PUBLIC_KEY_SIZE:
        return "not 32 bytes"
    if int.from_bytes(encoding, "little") & ((1 << 255) - 1) >= FIELD_PRIME:
        return "a non-canonical encoding (y >= 2^255 - 19)"
    if encoding in _SMALL_ORDER:
        return "a point of small order"
    return None


def signature_problem(signature: bytes) -> str | None:
    """Why a 64-byte Ed25519 signature (R, S) must not be trusted whatever it signs: a weak R,
    or S not below the group order (a malleated copy of another signature); None if sound."""
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_SIZE:
        return f"not {SIGNATURE_SIZE} bytes"
    if problem := point_problem(signature[:32]):
        return f"R is {problem}"
    if int.from_bytes(signature[32:], "little") >= GROUP_ORDER:
        return "S is not below the group order"
    return None


def verify_signature(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True when `signature` is `public_key`'s Ed25519 signature of `message`; never raises.
    A weak key or signature (`point_problem`, `signature_problem`) verifies nothing."""
    if point_problem(public_key) or signature_problem(signature):
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


@dataclass(frozen=True)
class Identity:
    """An Ed25519 key pair: `seed` is the raw 32-byte private key the libp2p host is built from."""

    seed: bytes
    public_key: bytes = field(init=False)

    def __post_init__(self) -> None:
        if len(self.seed) != SEED_SIZE:
            raise IdentityError(f"an Ed25519 private key has 32 bytes, not {len(self.seed)}")
        private = Ed25519PrivateKey.from_private_bytes(self.seed)
        object.__setattr__(self, "_private", private)
        public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        object.__setattr__(self, "public_key", public)

    @classmethod
    def generate(cls) -> Identity:
        return cls(os.urandom(SEED_SIZE))

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)  # type: ignore[attr-defined]

    def to_libp2p_private_key(self) -> bytes:
        """The key as libp2p's protobuf PrivateKey (Data = seed + public key), as go/rust write it."""
        return _PB_ED25519_PRIVATE + self.seed + self.public_key

    def __repr__(self) -> str:  # never print the seed by accident
        return f"Identity(peer_id={self.peer_id!r})"


def key_path(home: Path) -> Path:
    return Path(home) / KEY_FILE


def _parse_key_file(data: bytes, path: Path) -> Identity:
    if len(data) == len(_PB_ED25519_PRIVATE) + SEED_SIZE + PUBLIC_KEY_SIZE and data.startswith(
        _PB_ED25519_PRIVATE
    ):
        identity = Identity(data[4 : 4 + SEED_SIZE])
        if identity.public_key != data[4 + SEED_SIZE :]:
            raise IdentityError(f"{path}: the public key does not match the private key")
        return identity
    if len(data) == len(_PB_ED25519_SEED_ONLY) + SEED_SIZE and data.startswith(
        _PB_ED25519_SEED_ONLY
    ):
        return Identity(data[4:])
    if len(data) == SEED_SIZE:
        return Identity(data)
    raise IdentityError(f"{path} is not an Ed25519 key file ({len(data)} bytes)")


def load_identity(home: Path, create: bool = True) -> Identity:
    """The node's identity from HOME/identity.key, created (mode 0600) on first use if `create`."""
    path = key_path(home)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if not create:
            raise IdentityError(f"no key at {path}: run `swarm keys new`") from None
        return new_identity(home)
    except OSError as exc:
        raise IdentityError(f"cannot read {path}: {exc.strerror}") from None
    return _parse_key_file(data, path)


def new_identity(home: Path, force: bool = False) -> Identity:
    """Write a fresh key to HOME/identity.key; refuses to replace an existing one unless `force`."""
    path = key_path(home)
    if path.exists() and not force:
        raise IdentityError(
            f"{path} already exists: replacing it changes this node's peer id for good; "
            "pass --force if that is what you want"
        )
    identity = Identity.generate()
    # Write beside and rename, so that a crash never leaves half a key where the key was.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, identity.to_libp2p_private_key())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        raise IdentityError(f"cannot write {path}: {exc.strerror}") from None
    return identity
