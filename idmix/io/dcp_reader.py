"""Reading torch.distributed.checkpoint directories without running code from them.

DCP stores its ``.metadata`` as a pickle and loads every non-tensor item with
``torch.load(weights_only=False)``: a crafted checkpoint can run anything on load. Here the
metadata is unpickled by an allow-list of DCP's own record classes (dataclasses, torch.Size,
dtypes, paths) and byte items are loaded with ``weights_only=True`` (tensors and plain data).
"""

from __future__ import annotations

import io
import pickle

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import StorageMeta

_DCP = "torch.distributed.checkpoint"
ALLOWED_GLOBALS = {
    (f"{_DCP}.metadata", name)
    for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    )
} | {
    (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}  # fmt: skip


class UnsafeCheckpointError(ValueError):
    """A checkpoint file asks for something beyond plain checkpoint records."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, source: str):
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"checkpoint {self.source}: its metadata asks for {module}.{name}, which is not a "
            "checkpoint record; loading it could run code, so it is refused"
        )


def read_dcp_metadata(path) -> object:
    """The Metadata of a DCP directory, unpickled by the allow-list."""
    source = f"{str(path)!r}"
    meta_file = f"{path}/.metadata"
    with open(meta_file, "rb") as f:
        try:
            return _MetadataUnpickler(f, source).load()
        except UnsafeCheckpointError:
            raise
        except Exception as e:  # truncated or not a pickle
            raise ValueError(f"checkpoint {source}: unreadable .metadata ({e})") from None


class RestrictedReader(FileSystemReader):
    """FileSystemReader whose metadata is read by :func:`read_dcp_metadata`."""

    def read_metadata(self, *args, **kwargs):
        metadata = read_dcp_metadata(self.path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class TensorsOnlyPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that loads byte items with ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError:
            raise UnsafeCheckpointError(
                f"checkpoint item {read_item.dest_index.fqn!r} holds Python objects beyond "
                "tensors and plain data; loading it could run code, so it is refused"
            ) from None
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj
