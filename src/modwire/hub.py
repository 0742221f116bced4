"""The Hugging Face Hub: ``from_pretrained("org/name")`` and ``model.push_to_hub("org/name")``.

A Hub repo of a modwire model holds what ``save_pretrained`` writes: ``config.json`` (the config's
fields and ``model_type``), ``model.safetensors`` and ``manifest.json`` (their sha256), the layout of
``huggingface_hub.PyTorchModelHubMixin`` (its ``config.json`` has the same fields without
``model_type``; the model's own class reads it, :meth:`~modwire.models.base.PretrainedModel.from_pretrained`).

Optional: ``pip install 'modwire[hub]'``; ``huggingface_hub`` is imported only when a repo id is
loaded or a model pushed. A name that is an existing path is a folder; any other name that has the
form of a repo id (``name`` or ``org/name``) is looked up through ``hf_hub_download``, which reads
and fills the Hub's cache (``HF_HUB_CACHE``; with ``HF_HUB_OFFLINE=1`` or ``local_files_only`` it
only reads it). Only ``config.json``, ``model.safetensors`` and ``manifest.json`` are fetched: pickled
weights (``pytorch_model.bin``, which the mixin falls back to) never are, so nothing is unpickled.
The manifest is verified when the repo has one (pushed by modwire) and it is in the cache; a repo
without one (pushed by the mixin) is checked only as safetensors parses it.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from .errors import UserError
from .fields import check_keywords

__all__ = ["is_repo_id", "push_to_hub", "resolve"]

CONFIG_FILE, WEIGHTS_FILE, MANIFEST_FILE = "config.json", "model.safetensors", "manifest.json"
INSTALL = "pip install 'modwire[hub]' (huggingface_hub)"
#: ``from_pretrained``'s keywords for a repo id, those of ``hf_hub_download`` (:func:`snapshot`).
HUB_OPTIONS = ("revision", "cache_dir", "force_download", "token", "local_files_only")
# huggingface_hub's rule for repo ids (utils.validate_repo_id), restated so that a path that is not
# one is reported as a missing folder without importing the Hub client.
_REPO_ID = re.compile(r"(?:[A-Za-z0-9_.-]+/)?[A-Za-z0-9_.-]{1,96}")


def is_repo_id(name: Any) -> bool:
    """Whether ``name`` has the form of a Hub repo id (``name``, ``org/name``) and is not an existing path."""
    if not isinstance(name, str) or os.path.exists(name) or not _REPO_ID.fullmatch(name):
        return False
    return not ("--" in name or ".." in name or name.startswith((".", "-")) or name.endswith((".", "-", ".git")))


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise UserError(f"loading or pushing a Hub repo needs huggingface_hub: {INSTALL}") from None
    return huggingface_hub


def resolve(name_or_path: str | os.PathLike, **options: Any) -> Path:
    """The local folder that holds ``name_or_path``: itself unless it is a repo id (:func:`is_repo_id`),
    else the Hub cache's snapshot (:func:`snapshot`). ``options``: :data:`HUB_OPTIONS` (any other keyword is
    refused, naming them, before anything is read: ``from_pretrained``'s keywords end here)."""
    check_keywords("from_pretrained", options, HUB_OPTIONS, "(and map_location, config)" + (
        "; modwire loads every weight and refuses a mismatch: there is no strict=False" if "strict" in options else ""))
    if not is_repo_id(name_or_path):
        return Path(name_or_path)
    return snapshot(str(name_or_path), **options)


def snapshot(name: str, *, revision: str | None = None, cache_dir: str | os.PathLike | None = None,
             force_download: bool = False, token: str | bool | None = None, local_files_only: bool = False) -> Path:
    """The Hub cache's snapshot of repo ``name`` at ``revision`` with ``config.json`` (when the repo has one: a
    folder of accelerate's ``save_model`` has not), ``model.safetensors`` and ``manifest.json`` (when it has
    one), fetched through ``hf_hub_download``."""
    hub = _hub()
    from huggingface_hub.utils import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError, \
        RevisionNotFoundError

    where = f"{name!r} is not a folder, and as a Hub repo id"

    def get(filename: str, required: bool) -> str | None:
        try:
            return hub.hf_hub_download(name, filename, revision=revision, cache_dir=cache_dir,
                                       force_download=force_download, token=token,
                                       local_files_only=local_files_only, library_name="modwire")
        except LocalEntryNotFoundError as e:   # offline (HF_HUB_OFFLINE, local_files_only) or unreachable
            if not required:
                return None
            from huggingface_hub import constants

            cache = cache_dir or constants.HF_HUB_CACHE
            raise FileNotFoundError(f"{where}: its {filename} is not in the Hub cache {cache} and the Hub "
                                    f"was not reached ({_first_line(e)})") from None
        except (RepositoryNotFoundError, RevisionNotFoundError) as e:
            raise FileNotFoundError(f"{where}: {_first_line(e)}") from None
        except EntryNotFoundError:
            if not required:
                return None
            raise UserError(f"Hub repo {name!r} has no {filename}: modwire loads safetensors weights only and "
                            f"never unpickles (pytorch_model.bin); save the model with save_pretrained or "
                            f"safetensors") from None

    weights = get(WEIGHTS_FILE, required=True)
    get(CONFIG_FILE, required=False)
    get(MANIFEST_FILE, required=False)
    return Path(weights).parent   # one commit's snapshot folder holds all three


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def model_card(model_type: str) -> str:
    """A minimal ``README.md`` for a pushed model: the Hub's metadata (library, tags) and how to load it."""
    return (f"---\nlibrary_name: modwire\ntags:\n- modwire\n- {model_type}\n---\n\n"
            f"A modwire `{model_type}` model: `modwire.from_pretrained(\"<this repo id>\")` "
            f"(`pip install 'modwire[hub]'`).\n")


#: :func:`push_to_hub`'s keywords (those of ``PyTorchModelHubMixin.push_to_hub`` that upload a folder as it is).
PUSH_OPTIONS = ("commit_message", "private", "token", "branch", "create_pr")


def push_to_hub(model: Any, repo_id: str, *, commit_message: str = "Push model using modwire.",
                private: bool | None = None, token: str | None = None, branch: str | None = None,
                create_pr: bool | None = None) -> Any:
    """Create ``repo_id`` if needed and upload ``model.save_pretrained``'s folder (``config.json``,
    ``model.safetensors``, ``manifest.json``) with a model card, in one commit; returns the
    commit's info (its ``commit_url``), as ``PyTorchModelHubMixin.push_to_hub`` does."""
    hub = _hub()
    api = hub.HfApi(token=token)
    repo_id = api.create_repo(repo_id=repo_id, private=private, exist_ok=True).repo_id
    with tempfile.TemporaryDirectory(prefix="modwire-push-") as tmp:
        folder = model.save_pretrained(Path(tmp) / "model")
        (folder / "README.md").write_text(model_card(model.config.model_type), encoding="utf-8")
        return api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=folder,
                                 commit_message=commit_message, revision=branch, create_pr=create_pr)
