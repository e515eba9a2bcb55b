"""The prefix store's disk tier: safetensors files named by hash, bounded in bytes, read back only as written."""

from __future__ import annotations

import torch
from safetensors.torch import save, save_file

from kvviz.engine.disk_tier import SUFFIX, DiskTier


def _tensors(seed: int, n: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "k.0": torch.randn(1, 3, n, 64, generator=g),
        "v.0": torch.randn(1, 3, n, 64, generator=g).to(torch.bfloat16),
        "rows": torch.rand(2, 9, n, n, generator=g).to(torch.float16),
    }


def _files(tier: DiskTier) -> list:
    return sorted(tier.folder.glob("*" + SUFFIX))


def test_blocks_round_trip_bit_identically_with_their_meta(tmp_path):
    tier = DiskTier(tmp_path, 2**20)
    blocks = {bytes([i]) * 32: _tensors(i, 8) for i in range(3)}
    for h, t in blocks.items():
        assert tier.put(h, t, {"start": h[0]})
    assert [p.name for p in _files(tier)] == sorted(h.hex() + SUFFIX for h in blocks)
    for h, t in blocks.items():
        got, meta = tier.take(h)
        assert meta == {"start": h[0]} and got.keys() == t.keys()
        for name in t:
            assert got[name].dtype == t[name].dtype and torch.equal(
                got[name].view(torch.uint8), t[name].view(torch.uint8)
            )
    assert _files(tier) == [] and tier.used_bytes == 0 and len(tier) == 0  # a take moves the block back to memory


def test_the_tier_is_bounded_in_bytes_and_evicts_the_least_recently_written(tmp_path):
    one = len(save(_tensors(0, 16)))
    tier = DiskTier(tmp_path, 3 * one + one // 2)  # room for three blocks
    hashes = [bytes([i]) * 32 for i in range(6)]
    for i, h in enumerate(hashes):
        assert tier.put(h, _tensors(i, 16))
        on_disk = sum(p.stat().st_size for p in _files(tier))
        assert on_disk == tier.used_bytes <= tier.capacity_bytes
    assert [h for h in hashes if h in tier] == hashes[3:]
    assert tier.stats.evicted_blocks == 3 and tier.take(hashes[0]) is None
    assert not tier.put(b"x" * 32, _tensors(9, 64))  # larger than the whole tier: refused, nothing evicted
    assert tier.stats.too_big_blocks == 1 and len(tier) == 3


def test_a_tampered_file_is_refused_deleted_and_counted(tmp_path):
    tier = DiskTier(tmp_path, 2**20)
    h = b"a" * 32
    tier.put(h, _tensors(1, 8))
    path = tier.path(h)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # one bit of one tensor
    path.write_bytes(bytes(data))
    assert tier.take(h) is None
    assert tier.stats.refused_files == 1 and not path.exists() and tier.used_bytes == 0


def test_a_valid_safetensors_file_put_in_place_of_a_block_is_refused(tmp_path):
    tier = DiskTier(tmp_path, 2**20)
    h = b"b" * 32
    tier.put(h, _tensors(1, 8))
    save_file(_tensors(2, 8), str(tier.path(h)))  # same names, shapes and size: other values
    assert tier.path(h).stat().st_size == tier.used_bytes
    assert tier.take(h) is None and tier.stats.refused_files == 1


def test_a_file_the_tier_did_not_write_is_never_read(tmp_path):
    tier = DiskTier(tmp_path, 2**20)
    tier.put(b"c" * 32, _tensors(1, 8))
    planted = b"d" * 32
    save_file(_tensors(3, 8), str(tier.path(planted)))  # a file named like a block, in the tier's folder
    other = DiskTier(tmp_path, 2**20)  # another process's tier under the same cache folder
    other.put(planted, _tensors(3, 8))
    assert other.folder != tier.folder
    assert tier.take(planted) is None and tier.stats.read_blocks == 0
    assert tier.path(planted).exists()  # not even opened: it is not one of this tier's
    assert other.take(planted) is not None


def test_the_folder_is_the_servers_own_and_goes_with_the_tier(tmp_path):
    tier = DiskTier(tmp_path / "prefix-blocks", 2**20)
    tier.put(b"e" * 32, _tensors(1, 8))
    folder = tier.folder
    assert folder.parent == tmp_path / "prefix-blocks" and (folder.stat().st_mode & 0o777) == 0o700
    tier.close()
    assert not folder.exists()


def test_a_folder_that_cannot_be_made_leaves_the_tier_empty(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a folder under a plain file cannot be made, even by root
    tier = DiskTier(blocker / "prefix-blocks", 2**20)
    assert not tier.put(b"f" * 32, _tensors(1, 8))
    assert tier.stats.write_errors == 1 and len(tier) == 0 and tier.take(b"f" * 32) is None
