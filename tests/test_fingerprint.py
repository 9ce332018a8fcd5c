"""A local model directory's content is part of a cell's identity; a hub id's is not."""

from __future__ import annotations

from specrepro import identity
from specrepro.identity import local_model_fingerprint, profile_identity
from specrepro.params import load_profile


def _checkpoint(root):
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 8}')
    (root / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (root / "sub" / "model.safetensors").write_bytes(b"\x01" * 4096)
    (root / "MODEL_CARD.md").write_text("card")
    (root / "quality.json").write_text("{}")
    return root


def test_hub_ids_have_no_fingerprint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert local_model_fingerprint("Qwen/Qwen3.8-27B") is None


def test_weights_change_the_fingerprint_and_prose_does_not(tmp_path):
    ck = _checkpoint(tmp_path / "ck")
    first = local_model_fingerprint(str(ck))
    assert first is not None and len(first) == 16
    (ck / "MODEL_CARD.md").write_text("another card")
    (ck / "quality.json").write_text('{"x": 1}')
    (ck / "quality-light.json").write_text('{"x": 2}')  # an added drafter's training report
    assert local_model_fingerprint(str(ck)) == first
    data = bytearray((ck / "sub" / "model.safetensors").read_bytes())
    data[2000] ^= 0xFF  # one byte of a drafter's weights
    (ck / "sub" / "model.safetensors").write_bytes(bytes(data))
    assert local_model_fingerprint(str(ck)) != first
    (ck / "sub" / "model.safetensors").write_bytes(b"\x01" * 4096)
    assert local_model_fingerprint(str(ck)) == first  # same content, same fingerprint
    (ck / "extra.json").write_text("{}")
    assert local_model_fingerprint(str(ck)) != first  # a new file counts


def test_large_files_are_sampled_at_their_edges(tmp_path, monkeypatch):
    monkeypatch.setattr(identity, "FULL_HASH_LIMIT", 1024)
    monkeypatch.setattr(identity, "EDGE", 256)
    ck = _checkpoint(tmp_path / "ck")
    first = local_model_fingerprint(str(ck))
    data = bytearray((ck / "model.safetensors").read_bytes())  # 16 KiB > the limit
    data[8000] ^= 0xFF  # the middle: not read, by design
    (ck / "model.safetensors").write_bytes(bytes(data))
    assert local_model_fingerprint(str(ck)) == first
    data[10] ^= 0xFF  # the first EDGE bytes (a safetensors header): read
    (ck / "model.safetensors").write_bytes(bytes(data))
    assert local_model_fingerprint(str(ck)) != first


def test_profile_identity_carries_the_local_checkpoint(tmp_path, monkeypatch):
    ck = _checkpoint(tmp_path / "models" / "embedded")
    prof = tmp_path / "p.yaml"
    prof.write_text(
        "engine: embedded\ncommand: [python, -m, specrepro.embedded.serve]\n"
        "model: {id: models/embedded}\n")
    monkeypatch.chdir(tmp_path)
    before = profile_identity(load_profile(prof))
    assert before["model"]["content_sha256"] == local_model_fingerprint("models/embedded")
    (ck / "model.safetensors").write_bytes(b"retrained" * 100)
    assert profile_identity(load_profile(prof)) != before
    hub = tmp_path / "hub.yaml"
    hub.write_text("engine: vllm\ncommand: [vllm, serve]\nmodel: {id: Qwen/Qwen3.8-27B}\n")
    assert "content_sha256" not in profile_identity(load_profile(hub))["model"]
