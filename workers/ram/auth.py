"""The RAM tier's keys and copy authentication (the standard library, and ``cryptography``'s
AES-GCM for the copies' MAC).

Every key is derived from the run's secret (``RamTier.token``: the driver keeps it in the run
directory, so a later driver of the same run can still check the copies an earlier one made).
One key per use, so a value made for one cannot pass for another:

- the *hello* key answers a holder's challenge (``workers.ram.wire``): the secret never
  crosses the wire;
- the *copy* key authenticates each copy end to end: AES-256-GMAC (``copy_mac``) over what
  the copy claims to be (incarnation, step, source, sources, layout) and its bytes, computed
  once by the sending host and checked by the restoring host before any byte is used (and by
  a holder before it saves a copy durably). A holder, the wire or the disk can lose a copy,
  never change it unnoticed;
- the *holder* key answers the driver's challenge (``RamHolder.prove``), so the driver hands the
  secret only to a holder that already has it: an actor created first under a holder's name
  has not.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

_HELLO = b"tpu-orchestrator/ram-tier/hello/v1"
_COPY = b"tpu-orchestrator/ram-tier/copy/v1"
_HOLDER = b"tpu-orchestrator/ram-tier/holder/v1"


class CopyRejected(ValueError):
    """A copy that fails its authentication or is not the one asked for."""


@dataclass(frozen=True, repr=False)
class Keys:
    """The keys of one run's secret (no ``repr``: keys must not reach a log)."""

    hello: bytes
    copy: bytes

    @classmethod
    def from_token(cls, token: str) -> Keys:
        if not isinstance(token, str) or not token:
            raise ValueError("the RAM tier's token is empty: the driver issues one per run "
                             "(RamTier.token); pass it through")
        secret = token.encode()
        return cls(hello=hmac.new(secret, _HELLO, hashlib.sha256).digest(),
                   copy=hmac.new(secret, _COPY, hashlib.sha256).digest())


def same_token(given: str, held: str) -> bool:
    """Constant-time comparison of two tokens."""
    return hmac.compare_digest(given.encode(), held.encode())


def holder_proof(token: str, nonce: str, identity: str) -> str:
    """A holder's answer to the driver's challenge ``nonce``, bound to ``identity`` (the
    holder's own name: an answer one holder gives cannot pass for another's)."""
    key = hmac.new(token.encode(), _HOLDER, hashlib.sha256).digest()
    msg = struct.pack("!I", len(nonce)) + nonce.encode() + identity.encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def hello_proof(key: bytes, nonce: bytes, writer: str) -> str:
    """The answer to a holder's challenge ``nonce``, binding the connection to ``writer``."""
    msg = struct.pack("!I", len(nonce)) + nonce + writer.encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def check_hello(key: bytes, nonce: bytes, hello: Any) -> str:
    """The writer a hello frame authenticates; ``CopyRejected`` if it does not."""
    if not isinstance(hello, dict):
        raise CopyRejected("the hello is not an object")
    writer, proof = hello.get("writer"), hello.get("proof")
    if not isinstance(writer, str) or not writer or not isinstance(proof, str):
        raise CopyRejected("the hello names no writer or carries no proof")
    if not hmac.compare_digest(proof.encode(), hello_proof(key, nonce, writer).encode()):
        raise CopyRejected("the hello's proof does not match this run's secret")
    return writer


GMAC = "g1:"
"""The prefix of a copy MAC made with AES-256-GMAC (``copy_mac``); a MAC without it is the
HMAC-SHA256 of copies made before (still checked: copies saved from RAM outlive versions)."""
NONCE_BYTES = 12
_CHUNK = 16 * 1024 * 1024
"""Bytes fed to the MAC per call: the GIL is held at most this long (~1 ms) at a time."""


def copy_mac(key: bytes, *, incarnation: int, step: int, source: int, sources: int,
             layout: Any, data: Any, nonce: bytes | None = None) -> str:
    """The MAC of a copy, over its description, then its bytes (read in place): AES-256-GMAC
    under ``key`` with a random 96-bit ``nonce`` per copy, written ``g1:<nonce><tag>`` (hex).
    GMAC, not HMAC-SHA256, because every copy is MACed by its sender and checked by its
    restorer, whole: 17-22 GB/s here (AES-NI and carry-less multiply) against 1.5-1.7 GB/s, so
    a GiB costs 0.05 s of a core instead of 0.6 s. Random nonces keep each one unique under the
    run's key far beyond the copies a run makes (NIST SP 800-38D, 8.3: 2^32 per key)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    meta = json.dumps([int(incarnation), int(step), int(source), int(sources), layout],
                      sort_keys=True, separators=(",", ":")).encode()
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a copy MAC's nonce is {NONCE_BYTES} bytes")
    mac = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
    mac.authenticate_additional_data(struct.pack("!Q", len(meta)) + meta)
    for part in data if isinstance(data, list | tuple) else (data,):  # a buffer, or its parts
        view = memoryview(part).cast("B")
        for i in range(0, len(view), _CHUNK):
            mac.authenticate_additional_data(view[i:i + _CHUNK])
    mac.finalize()
    return GMAC + nonce.hex() + mac.tag.hex()


def _hmac_copy_mac(key: bytes, *, incarnation: int, step: int, source: int, sources: int,
                   layout: Any, data: bytes | bytearray | memoryview) -> str:
    """HMAC-SHA256 (hex) of a copy, as copies made before GMAC carry it."""
    meta = json.dumps([int(incarnation), int(step), int(source), int(sources), layout],
                      sort_keys=True, separators=(",", ":")).encode()
    mac = hmac.new(key, struct.pack("!Q", len(meta)) + meta, "sha256")
    mac.update(data)
    return mac.hexdigest()


def valid_mac_text(mac: Any) -> bool:
    """Whether ``mac`` has a copy MAC's form (GMAC, or a legacy HMAC-SHA256): what a holder
    checks before it keeps a copy."""
    if not isinstance(mac, str):
        return False
    body = mac[len(GMAC):] if mac.startswith(GMAC) else mac
    want = 2 * (NONCE_BYTES + 16) if mac.startswith(GMAC) else 64
    return len(body) == want and all(c in "0123456789abcdef" for c in body)


def pieces_mac(key: bytes, copy: dict, pieces: list[int], parts: list) -> str:
    """A holder's MAC over some pieces of a copy it verified whole (``copy``: its fields;
    ``parts``: the pieces' bytes in order): its description and the piece indices, then those
    bytes, so a restore reads only the pieces its shards need and still uses nothing
    unauthenticated. Under the copy key, which only the run's processes hold."""
    return copy_mac(key, incarnation=copy["incarnation"], step=copy["step"],
                    source=copy["source"], sources=copy["sources"],
                    layout={"layout": copy["layout"], "pieces": pieces}, data=parts)


def copy_intact(key: bytes, got: dict) -> bool:
    """Whether ``got`` (``RamHolder.get`` / ``copy_store.read``) carries its own valid MAC."""
    mac = got.get("mac")
    if not valid_mac_text(mac):
        return False
    try:
        layout = got["layout"]
        if got.get("pieces") is not None:  # a holder's read of some pieces (``pieces_mac``)
            if not mac.startswith(GMAC):
                return False
            layout = {"layout": layout, "pieces": got["pieces"]}
        fields = dict(incarnation=got["incarnation"], step=got["step"], source=got["source"],
                      sources=got["sources"], layout=layout, data=got["data"])
        want = (copy_mac(key, nonce=bytes.fromhex(mac[len(GMAC):][:2 * NONCE_BYTES]), **fields)
                if mac.startswith(GMAC) else _hmac_copy_mac(key, **fields))
    except (KeyError, TypeError, ValueError):
        return False
    return hmac.compare_digest(mac.encode(), want.encode())


def verify_copy(key: bytes, got: dict, *, step: int, name: str) -> None:
    """Refuse (``CopyRejected``) a copy that is not authentic or not of ``step``."""
    if not copy_intact(key, got):
        raise CopyRejected(f"the copy of {name} fails its authentication (its MAC under "
                           "this run's secret): damaged, forged, or made by another run")
    if got["step"] != step:
        raise CopyRejected(f"the copy of {name} is of step {got['step']}, not {step}")
