"""The Hugging Face Hub layout (issue 38): a folder written by ``save_pretrained`` loads through
``huggingface_hub.PyTorchModelHubMixin.from_pretrained`` and the mixin's folder through modwire; a repo id
resolves through the Hub's cache with no network (``HF_HUB_OFFLINE=1``, a cache built here in the
layout ``hf_hub_download`` reads: ``models--org--name/{refs/main, snapshots/<commit>/<file> → blobs/}``);
``push_to_hub`` uploads the folder (to a local stand-in for the Hub API). Pickled weights are never read,
and the manifest is verified when the repo has one. Skipped without huggingface_hub (``modwire[hub]``)."""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch

import modwire
from modwire.errors import UserError
from modwire.models.nac import NAC

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """huggingface_hub, offline, with its default cache in ``tmp_path / "hub-cache"``."""
    hf = pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)           # read at import: set it for this test
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    return hf


def mixin_classes(hf):
    """A modwire model class wearing the mixin: its save/from_pretrained are the mixin's (mixin first)."""
    class MixinNAC(hf.PyTorchModelHubMixin, NAC):
        pass
    return MixinNAC


def logits(model, seed=0):
    inputs = model.config.example_inputs(2, seed=seed)
    with torch.no_grad():
        return model.eval()(**inputs)


def cache_repo(cache: Path, repo_id: str, folder: Path, commit: str = COMMIT) -> Path:
    """Put ``folder``'s files into the Hub cache as the snapshot ``commit`` of ``repo_id``'s ``main``, the way
    ``hf_hub_download`` stores a download (content-addressed blobs, a snapshot of relative symlinks, a ref)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in sorted(folder.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_a_modwire_folder_loads_through_the_mixin_and_the_mixins_folder_through_modwire(hub, tmp_path):
    MixinNAC = mixin_classes(hub)
    model = modwire.create_model("nac_micro").eval()
    expected = logits(model)

    model.save_pretrained(tmp_path / "modwire")
    through_mixin = MixinNAC.from_pretrained(tmp_path / "modwire")      # the mixin's own loader
    assert type(through_mixin) is MixinNAC and through_mixin.config == model.config
    torch.testing.assert_close(logits(through_mixin), expected, rtol=0, atol=0)

    through_mixin.save_pretrained(tmp_path / "again")      # the mixin keeps the config.json it read
    torch.testing.assert_close(logits(modwire.from_pretrained(tmp_path / "again")), expected, rtol=0, atol=0)

    built = MixinNAC(model.config)                          # a mixin model built from a config object
    built.load_state_dict(model.state_dict())
    built.save_pretrained(tmp_path / "mixin")               # the mixin's own writer
    saved = json.loads((tmp_path / "mixin" / "config.json").read_text())
    assert "model_type" not in saved and saved["d_model"] == model.config.d_model   # the one key that differs
    back = NAC.from_pretrained(tmp_path / "mixin")
    assert type(back) is NAC and back.config == model.config
    torch.testing.assert_close(logits(back), expected, rtol=0, atol=0)
    # the generic loader cannot tell the architecture without model_type: it says which loader can
    with pytest.raises(UserError, match=r"no 'model_type' key; a folder saved by PyTorchModelHubMixin names none: "
                                        r"load it with its model class, e\.g\. .*NAC\.from_pretrained"):
        modwire.from_pretrained(tmp_path / "mixin")


def test_with_the_model_class_first_modwire_loads_and_saves_for_the_mixin(hub, tmp_path):
    """``class NACHub(NAC, PyTorchModelHubMixin)`` (the mixin's documented order: the model first): the
    instance is the mixin's, its save/load are modwire's (strict, the manifest, no pickles)."""
    class NACHub(NAC, hub.PyTorchModelHubMixin):
        pass
    model = modwire.create_model("nac_micro").eval()
    model.save_pretrained(tmp_path / "m")
    loaded = NACHub.from_pretrained(tmp_path / "m")
    assert isinstance(loaded, hub.PyTorchModelHubMixin) and loaded.config == model.config
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)
    assert sorted(p.name for p in loaded.save_pretrained(tmp_path / "again").iterdir()) == \
        ["config.json", "manifest.json", "model.safetensors"]
    state = dict(model.state_dict())
    state.pop("signatures" if "signatures" in state else next(iter(state)))
    (tmp_path / "partial").mkdir()
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "partial" / "model.safetensors"))
    with pytest.raises(UserError, match=r"do not match the config: missing \["):   # the mixin would load it
        NACHub.from_pretrained(tmp_path / "partial", config=model.config)      # non-strictly (strict=False)


def test_the_mixin_refuses_a_config_of_another_model_type(hub, tmp_path):
    """Where the mixin passes config.json as a dict, the model class reads it with its model_type check."""
    modwire.create_model("perceiver_io_micro").save_pretrained(tmp_path / "pio")
    with pytest.raises(UserError, match=r"config is for model_type 'perceiver_io', not 'nac'"):
        mixin_classes(hub).from_pretrained(tmp_path / "pio")


def test_a_repo_id_resolves_through_the_hub_cache_offline(hub, tmp_path):
    model = modwire.create_model("nac_micro").eval()
    expected = logits(model)
    snapshot = cache_repo(tmp_path / "hub-cache", "org/nac-micro", model.save_pretrained(tmp_path / "m"))

    for loaded in (modwire.from_pretrained("org/nac-micro"),             # HF_HUB_CACHE, refs/main
                   NAC.from_pretrained("org/nac-micro", revision=COMMIT),
                   modwire.from_pretrained("org/nac-micro", cache_dir=tmp_path / "hub-cache", local_files_only=True),
                   mixin_classes(hub).from_pretrained("org/nac-micro"),   # the mixin, through the same cache
                   modwire.create_model("hf-hub:org/nac-micro")):          # timm's prefix
        assert loaded.config == model.config
        torch.testing.assert_close(logits(loaded), expected, rtol=0, atol=0)

    with pytest.raises(UserError, match=r"create_model\('hf-hub:org/nac-micro'\): a model from the Hub is built"):
        modwire.create_model("hf-hub:org/nac-micro", num_classes=3)
    with pytest.raises(UserError, match=r"expected a Hub repo id after 'hf-hub:'"):
        modwire.create_model("hf-hub:")

    # the repo's manifest came with it and is verified: a damaged blob in the cache is refused
    blob = (snapshot / "model.safetensors").resolve()
    raw = bytearray(blob.read_bytes())
    raw[-3] ^= 0x40
    blob.write_bytes(bytes(raw))
    with pytest.raises(UserError, match=r"model\.safetensors is corrupted: its sha256 differs"):
        modwire.from_pretrained("org/nac-micro")


def test_a_repo_without_a_manifest_loads_and_a_missing_repo_names_the_cache(hub, tmp_path):
    MixinNAC = mixin_classes(hub)
    model = MixinNAC(modwire.get_config("nac_micro"))
    model.save_pretrained(tmp_path / "pushed-by-mixin")                   # config.json (no model_type), weights
    assert sorted(p.name for p in (tmp_path / "pushed-by-mixin").iterdir()) == \
        ["README.md", "config.json", "model.safetensors"]
    cache_repo(tmp_path / "hub-cache", "org/mixin-nac", tmp_path / "pushed-by-mixin")
    loaded = NAC.from_pretrained("org/mixin-nac")                        # nothing to verify but the format
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)

    with pytest.raises(FileNotFoundError, match=r"'org/absent' is not a folder, and as a Hub repo id: its "
                                                r"model\.safetensors is not in the Hub cache .*hub-cache"):
        modwire.from_pretrained("org/absent")
    # a path that cannot be a repo id is a missing folder, as before (no Hub look-up)
    with pytest.raises(FileNotFoundError, match=r"not a saved modwire model: expected .*/no/such/config\.json"):
        modwire.from_pretrained(tmp_path / "no" / "such")


class _Sentinel:
    """Unpickling this writes a file: proof that a pickle was (or was not) loaded."""
    path = ""

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "unpickled"))


def test_pickled_weights_are_never_loaded(hub, tmp_path):
    folder, sentinel = tmp_path / "pickled", tmp_path / "ran"
    folder.mkdir()
    _Sentinel.path = str(sentinel)
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Sentinel()))
    (folder / "config.json").write_text(modwire.get_config("nac_micro").to_json())
    with pytest.raises(FileNotFoundError, match=r"holds pickled weights \(pytorch_model\.bin\), which modwire never "
                                                r"loads"):
        modwire.from_pretrained(folder)
    cache_repo(tmp_path / "hub-cache", "org/pickled", folder)             # the same repo on the Hub
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors is not in the Hub cache"):
        NAC.from_pretrained("org/pickled")
    assert not sentinel.exists()
    # online, the Hub answers that the file does not exist: modwire says why it will not take the .bin
    from huggingface_hub.utils import EntryNotFoundError

    def absent(repo_id, filename, **kwargs):
        raise EntryNotFoundError(f"{filename} not in {repo_id}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hub, "hf_hub_download", absent)
        with pytest.raises(UserError, match=r"Hub repo 'org/pickled' has no model\.safetensors: modwire loads "
                                            r"safetensors weights only and never unpickles"):
            modwire.from_pretrained("org/pickled")
    assert not sentinel.exists()


def test_push_to_hub_uploads_the_save_pretrained_folder(hub, tmp_path, monkeypatch):
    """``push_to_hub`` against a stand-in for the Hub API (no network): the uploaded folder, put into the
    cache as a download would, loads by repo id."""
    remote, calls = tmp_path / "remote", []

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        calls.append(("create_repo", repo_id, private, exist_ok))
        return hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, repo_type=None, commit_message=None, revision=None,
                      create_pr=None, **kwargs):
        calls.append(("upload_folder", repo_id, repo_type, commit_message, revision))
        shutil.copytree(folder_path, remote)
        return f"https://huggingface.co/{repo_id}/commit/{COMMIT}"
    monkeypatch.setattr(hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(hub.HfApi, "upload_folder", upload_folder)

    model = modwire.create_model("nac_micro").eval()
    url = model.push_to_hub("me/nac-micro", private=True, commit_message="first")
    assert url.endswith(f"me/nac-micro/commit/{COMMIT}")
    assert calls == [("create_repo", "me/nac-micro", True, True),
                     ("upload_folder", "me/nac-micro", "model", "first", None)]
    assert sorted(p.name for p in remote.iterdir()) == \
        ["README.md", "config.json", "manifest.json", "model.safetensors"]
    assert "library_name: modwire" in (remote / "README.md").read_text()
    cache_repo(tmp_path / "hub-cache", "me/nac-micro", remote)
    torch.testing.assert_close(logits(modwire.from_pretrained("me/nac-micro")), logits(model), rtol=0, atol=0)


def test_a_folder_of_weights_without_config_loads_with_an_explicit_config(hub, tmp_path):
    """accelerate's ``save_model`` writes ``model.safetensors`` alone (``safetensors.torch.save_model``)."""
    from safetensors.torch import save_model

    model = modwire.create_model("nac_micro").eval()
    (tmp_path / "acc").mkdir()
    save_model(model, str(tmp_path / "acc" / "model.safetensors"))
    with pytest.raises(FileNotFoundError, match=r"holds model\.safetensors without config\.json \(as accelerate's "
                                                r"save_model writes\): pass the model's config: from_pretrained\("):
        modwire.from_pretrained(tmp_path / "acc")
    for loaded in (modwire.from_pretrained(tmp_path / "acc", config=model.config),
                   NAC.from_pretrained(tmp_path / "acc", config=model.config)):
        torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)
    with pytest.raises(UserError, match=r"holds its own config\.json: config= is for a folder of weights without one"):
        modwire.from_pretrained(model.save_pretrained(tmp_path / "full"), config=model.config)
    (tmp_path / "sharded").mkdir()
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    with pytest.raises(FileNotFoundError, match=r"holds weights in shards \(model\.safetensors\.index\.json\), which "
                                                r"modwire does not read: save them as one file"):
        modwire.from_pretrained(tmp_path / "sharded", config=model.config)


def test_a_repo_id_without_huggingface_hub_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)             # as if not installed
    with pytest.raises(UserError, match=r"loading or pushing a Hub repo needs huggingface_hub: "
                                        r"pip install 'modwire\[hub\]'"):
        modwire.from_pretrained("org/name")
    with pytest.raises(UserError, match=r"needs huggingface_hub"):
        modwire.create_model("nac_micro").push_to_hub("org/name")


def test_an_unknown_keyword_is_refused_naming_the_ones_taken_before_anything_is_read(tmp_path):
    """``strict=`` (the mixin's) or a misspelt Hub keyword to either ``from_pretrained``, or an unknown one to
    ``push_to_hub``: a UserTypeError (also a TypeError) naming it and what is taken, raised before the missing
    folder or the Hub client (not installed: fine) is reached."""
    missing = tmp_path / "nothing-here"
    for load in (modwire.from_pretrained, NAC.from_pretrained):
        with pytest.raises(TypeError, match=r"unknown keyword argument\(s\) \['strict'\].*no strict=False"):
            load(missing, strict=False)
        with pytest.raises(UserError, match=r"\['revison'\].*'local_files_only'.*Did you mean \['revision'\]"):
            load("org/name", revison="main")
    model = modwire.create_model("nac_micro")
    with pytest.raises(UserError, match=r"push_to_hub: unknown keyword argument\(s\) \['privat'\].*\['private'\]"):
        model.push_to_hub("org/name", privat=True)
