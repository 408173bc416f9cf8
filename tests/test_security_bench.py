"""measure_aead: shape of the result on tiny sizes (the real run is `forkv bench store`)."""

from forkv.security.bench import measure_aead


def test_measure_aead_small(tmp_path):
    result = measure_aead(sizes=(4096, 65536), reps=2, disk_dir=str(tmp_path))
    assert result["cipher"] == "aes-256-gcm" and len(result["results"]) == 2
    for row in result["results"]:
        assert set(row) == {"size_bytes", "seal_gbps", "open_gbps", "put_ms", "write_ms", "get_ms"}
        assert all(v > 0 for v in row.values())
