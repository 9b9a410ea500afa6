"""The copies' MAC (AES-256-GMAC, ``workers.ram.auth.copy_mac``): it binds a copy's description
and bytes, each copy gets its own nonce, and copies MACed with HMAC-SHA256 by earlier versions
(saved from RAM to disk) still verify."""

from __future__ import annotations

import hmac
import json
import struct

from workers.ram import auth as ram_auth

KEY = ram_auth.Keys.from_token("test-secret").copy
DESC = dict(incarnation=1, step=7, source=0, sources=2, layout={"leaves": [], "pieces": []})


def _got(data: bytes, mac: str, **changed) -> dict:
    return {**DESC, **changed, "data": data, "mac": mac}


def test_a_gmac_copy_verifies_and_any_change_to_it_is_caught():
    data = bytes(range(256)) * 4096
    mac = ram_auth.copy_mac(KEY, data=data, **DESC)
    assert mac.startswith(ram_auth.GMAC) and ram_auth.valid_mac_text(mac)
    assert ram_auth.copy_intact(KEY, _got(data, mac))
    flipped = bytearray(data)
    flipped[-1] ^= 1
    assert not ram_auth.copy_intact(KEY, _got(bytes(flipped), mac))
    assert not ram_auth.copy_intact(KEY, _got(data, mac, step=8))
    assert not ram_auth.copy_intact(ram_auth.Keys.from_token("another").copy, _got(data, mac))
    assert not ram_auth.copy_intact(KEY, _got(data, mac[:-1] + ("0" if mac[-1] != "0" else "1")))


def test_each_copy_gets_its_own_nonce():
    macs = {ram_auth.copy_mac(KEY, data=b"same", **DESC) for _ in range(50)}
    assert len(macs) == 50


def test_a_copy_macd_with_hmac_sha256_by_an_earlier_version_still_verifies():
    data = b"\x01" * 1000
    meta = json.dumps([1, 7, 0, 2, DESC["layout"]], sort_keys=True,
                      separators=(",", ":")).encode()
    legacy = hmac.new(KEY, struct.pack("!Q", len(meta)) + meta + data, "sha256").hexdigest()
    assert ram_auth.valid_mac_text(legacy)
    assert ram_auth.copy_intact(KEY, _got(data, legacy))
    assert not ram_auth.copy_intact(KEY, _got(data + b"\x00", legacy))


def test_malformed_macs_are_refused_before_any_work():
    for bad in (None, 7, "", "g1:", "g1:zz" + "0" * 54, "0" * 63, "G1:" + "0" * 56):
        assert not ram_auth.valid_mac_text(bad)
        assert not ram_auth.copy_intact(KEY, _got(b"x", bad))
