"""Hugging Face Llama checkpoints <-> the ``llama`` family's parameter tree, both ways.

A Hugging Face Llama directory is ``config.json`` plus ``model.safetensors`` or shards named by
``model.safetensors.index.json``. ``config_from_hf`` reads the config into ``LlamaConfig``
fields and refuses, naming the field, what the family does not compute (another activation,
biases, RoPE scaling, a head_dim other than hidden_size / heads, dropout); ``config_to_hf``
writes one ``LlamaForCausalLM`` loads (with both the 4.x ``rope_theta`` and the 5.x
``rope_parameters`` spelling of RoPE).

Tensors: Hugging Face stores each projection as ``nn.Linear.weight``, (out, in); the family's
``DenseGeneral`` kernels are (in..., out...) with heads split out: ``q`` is (d_model, heads,
head_dim), ``o`` is (heads, head_dim, d_model). So a kernel is ``weight.T`` reshaped, and back
``kernel.reshape(in, out).T``: pure data movement, bit for bit. No row permutation of q/k is
needed: the family's ``apply_rope`` rotates the two halves of each head with frequencies
``theta^(-2i/head_dim)``, as transformers' ``rotate_half`` does (Meta's original weights use
interleaved pairs; Hugging Face's conversion script already permuted them). With
``scan_layers`` the layers are stacked on a leading axis of ``params['layers']``, otherwise
``params['layer<i>']``. Tied embeddings: no ``lm_head`` either side.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from orchestrator.shared.errors import OrchestratorError
from workers.models.llama import LlamaConfig
from workers.models.safetensors_io import SafetensorsFile

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
IGNORED = ("rotary_emb.inv_freq",)
"""Buffers some older checkpoints saved beside the weights; recomputed, never read."""


class HfCheckpointError(OrchestratorError):
    """A Hugging Face checkpoint this family cannot take, or that does not fit the task."""


# ---------------------------------------------------------------- config.json

_SHAPE = {  # LlamaConfig field <- config.json field
    "vocab_size": "vocab_size", "d_model": "hidden_size", "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads", "d_ff": "intermediate_size",
}
HF_FIELD = {**_SHAPE, "num_kv_heads": "num_key_value_heads", "rope_theta": "rope_theta",
            "norm_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings"}
"""Each model field this module maps, and the config.json field it comes from."""
_MUST = {"hidden_act": ("silu", "silu"), "attention_bias": (False, False),
         "mlp_bias": (False, False), "attention_dropout": (0.0, 0.0)}
"""config.json field -> (what the family computes, the value an absent field means)."""


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / CONFIG
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise HfCheckpointError(f"{path} cannot be read as JSON ({type(exc).__name__}: {exc}).",
                                fix="point at a Hugging Face model directory (config.json "
                                    "beside model.safetensors)") from None
    if not isinstance(data, dict):
        raise HfCheckpointError(f"{path} is not a JSON object.",
                                fix="point at a Hugging Face model directory")
    return data


def config_from_hf(hf: Mapping[str, Any], *, source: str = CONFIG) -> dict[str, Any]:
    """The ``LlamaConfig`` fields ``hf`` (a config.json) sets; ``HfCheckpointError`` naming the
    field for anything the family would compute differently."""
    def refuse(field: str, why: str, fix: str) -> HfCheckpointError:
        return HfCheckpointError(f"{source}: `{field}` = {hf.get(field)!r}: {why}.", fix=fix)

    if hf.get("model_type", "llama") != "llama":
        raise refuse("model_type", "only Llama (LlamaForCausalLM) checkpoints are taken",
                     "convert from a model_type llama checkpoint")
    for field, (want, absent) in _MUST.items():
        if hf.get(field, absent) != want:
            raise refuse(field, f"the llama family computes {field} = {want!r}",
                         f"use a checkpoint with {field} {json.dumps(want)}")
    out: dict[str, Any] = {}
    for ours, theirs in _SHAPE.items():
        value = hf.get(theirs)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise refuse(theirs, "not a whole number >= 1", f"set {theirs} in {source}")
        out[ours] = value
    kv = hf.get("num_key_value_heads")
    if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1):
        raise refuse("num_key_value_heads", "not a whole number >= 1",
                     "set num_key_value_heads (or leave it out: as many as the heads)")
    out["num_kv_heads"] = out["num_heads"] if kv is None else kv
    head_dim = out["d_model"] // out["num_heads"]
    if hf.get("head_dim") not in (None, head_dim):
        raise refuse("head_dim", f"the family's head dim is hidden_size / num_attention_heads "
                     f"= {head_dim}", "use a checkpoint whose head_dim is hidden_size / heads")
    out["rope_theta"] = float(_rope_theta(hf, refuse))
    eps = hf.get("rms_norm_eps", 1e-6)  # transformers' LlamaConfig default
    if not isinstance(eps, int | float) or isinstance(eps, bool) or eps <= 0:
        raise refuse("rms_norm_eps", "not a number > 0", "set rms_norm_eps in " + source)
    out["norm_eps"] = float(eps)
    out["tie_embeddings"] = bool(hf.get("tie_word_embeddings", False))
    return out


def _rope_theta(hf: Mapping[str, Any], refuse: Callable[..., HfCheckpointError]) -> float:
    """``rope_theta`` from either spelling: 4.x (``rope_theta``, ``rope_scaling``) or 5.x
    (``rope_parameters: {rope_type, rope_theta}``); only unscaled ("default") RoPE."""
    if hf.get("rope_scaling") is not None:
        raise refuse("rope_scaling", "the family applies no RoPE scaling (Llama 3.1+'s "
                     "'llama3' long-context scaling included)",
                     "use a checkpoint with rope_scaling null, or add that scaling to "
                     "workers/models/llama.py's apply_rope first")
    params = hf.get("rope_parameters")
    theta = hf.get("rope_theta")
    if params is not None:
        if not isinstance(params, Mapping) or params.get("rope_type", "default") != "default":
            raise refuse("rope_parameters", "the family applies only unscaled RoPE "
                         "(rope_type default)", "use a checkpoint with rope_type default")
        if theta is not None and params.get("rope_theta", theta) != theta:
            raise refuse("rope_theta", f"differs from rope_parameters.rope_theta "
                         f"{params.get('rope_theta')!r}", "make the two agree")
        theta = params.get("rope_theta", theta)
    theta = 10_000.0 if theta is None else theta  # transformers' LlamaConfig default
    if not isinstance(theta, int | float) or isinstance(theta, bool) or theta <= 0:
        raise refuse("rope_theta", "not a number > 0", "set rope_theta to the model's")
    return theta


def check_matches(cfg: LlamaConfig, hf: Mapping[str, Any], *, source: str,
                  setting: str = "task.model") -> None:
    """The checkpoint's config describes ``cfg``'s model, field by field; else the first
    mismatch is refused, naming the task setting and the value to set."""
    got = config_from_hf(hf, source=source)
    for field, value in got.items():
        ours = getattr(cfg, field)
        if ours != value:
            exc = HfCheckpointError(
                f"{source}: `{HF_FIELD[field]}` = {value!r}, but the task's {setting}.{field} "
                f"= {ours!r}.",
                fix=f"set {setting}.{field}={json.dumps(value)} (or pick the checkpoint "
                    "of the task's model)")
            exc.setting = f"{setting}.{field}"  # the setting to change (task.init_from's check)
            raise exc


def config_of_task(settings: Mapping[str, Any]) -> LlamaConfig:
    """The model of a ``llama`` task's settings (``{preset, model}``, as ``LlamaSettings``
    builds it; ``workers.task.llama`` imports this module, so not through it)."""
    return LlamaConfig.preset(settings.get("preset", "tiny"), **(settings.get("model") or {}))


def config_to_hf(cfg: LlamaConfig, *, dtype: str = "float32", **extra: Any) -> dict[str, Any]:
    """A config.json for ``cfg`` that transformers 4.x and 5.x load as this model."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.seq_len, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "pretraining_tp": 1, "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": dtype, "dtype": dtype, "use_cache": True, **extra,
    }


# ---------------------------------------------------------------- tensors


@dataclass(frozen=True)
class Tensor:
    """One Hugging Face tensor and where it lives in the family's tree."""

    hf: str
    path: tuple[str, ...]
    """Key path in the tree; under ``layers`` (or ``layer<i>``) for a per-layer tensor."""
    layer: int | None
    n_in: int | None
    """Leading kernel axes that are the Linear's input (None: stored as is)."""
    kernel: tuple[int, ...]
    """The family's shape for one layer."""

    @property
    def hf_shape(self) -> tuple[int, ...]:
        if self.n_in is None:
            return self.kernel
        return (int(np.prod(self.kernel[self.n_in:])), int(np.prod(self.kernel[:self.n_in])))


def tensors(cfg: LlamaConfig) -> list[Tensor]:
    """Every tensor of ``cfg``'s model, in transformers' ``state_dict`` order."""
    d, hd, h, kv, ff = cfg.d_model, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.d_ff
    per_layer = [
        ("input_layernorm.weight", ("attn_norm", "scale"), None, (d,)),
        ("self_attn.q_proj.weight", ("attn", "q", "kernel"), 1, (d, h, hd)),
        ("self_attn.k_proj.weight", ("attn", "k", "kernel"), 1, (d, kv, hd)),
        ("self_attn.v_proj.weight", ("attn", "v", "kernel"), 1, (d, kv, hd)),
        ("self_attn.o_proj.weight", ("attn", "o", "kernel"), 2, (h, hd, d)),
        ("post_attention_layernorm.weight", ("mlp_norm", "scale"), None, (d,)),
        ("mlp.gate_proj.weight", ("mlp", "gate", "kernel"), 1, (d, ff)),
        ("mlp.up_proj.weight", ("mlp", "up", "kernel"), 1, (d, ff)),
        ("mlp.down_proj.weight", ("mlp", "down", "kernel"), 1, (ff, d)),
    ]
    out = [Tensor("model.embed_tokens.weight", ("embed", "embedding"), None, None,
                  (cfg.vocab_size, d))]
    for i in range(cfg.num_layers):
        out += [Tensor(f"model.layers.{i}.{name}", path, i, n_in, shape)
                for name, path, n_in, shape in per_layer]
    out.append(Tensor("model.norm.weight", ("final_norm", "scale"), None, None, (d,)))
    if not cfg.tie_embeddings:
        out.append(Tensor("lm_head.weight", ("lm_head", "kernel"), None, 1, (d, cfg.vocab_size)))
    return out


def to_kernel(t: Tensor, weight: np.ndarray) -> np.ndarray:
    """A Hugging Face tensor as the family's (one layer's) parameter."""
    return weight if t.n_in is None else weight.T.reshape(t.kernel)


def from_kernel(t: Tensor, kernel: np.ndarray) -> np.ndarray:
    """The family's (one layer's) parameter as the Hugging Face tensor, C-contiguous."""
    if t.n_in is None:
        return np.ascontiguousarray(kernel)
    return np.ascontiguousarray(kernel.reshape(t.hf_shape[::-1]).T)


def layer_leaf(params: Mapping[str, Any], cfg: LlamaConfig, t: Tensor) -> np.ndarray:
    """``t``'s parameter (one layer's) in the family's tree; a view, not a copy."""
    if t.layer is None:
        node: Any = params
        for key in t.path:
            node = node[key]
        return np.asarray(node)
    if cfg.scan_layers:
        node = params["layers"]
        for key in t.path:
            node = node[key]
        return np.asarray(node[t.layer])
    node = params[f"layer{t.layer}"]
    for key in t.path:
        node = node[key]
    return np.asarray(node)


def hf_tensors(params: Mapping[str, Any], cfg: LlamaConfig, dtype: Any = None
               ) -> Iterator[tuple[str, np.ndarray]]:
    """(name, tensor) of the family's ``params`` in Hugging Face's names and layout, one at a
    time, cast to ``dtype`` when given (numpy's round to nearest even for bfloat16)."""
    for t in tensors(cfg):
        arr = from_kernel(t, layer_leaf(params, cfg, t))
        yield t.hf, arr if dtype is None else arr.astype(dtype)


def leaf_tensors(cfg: LlamaConfig) -> dict[tuple[str, ...], list[Tensor]]:
    """Each leaf's key path in the family's tree -> its Hugging Face tensors (one per layer, in
    layer order, for a leaf stacked by ``scan_layers``)."""
    out: dict[tuple[str, ...], list[Tensor]] = {}
    for t in tensors(cfg):
        key = (t.path if t.layer is None else ("layers", *t.path) if cfg.scan_layers
               else (f"layer{t.layer}", *t.path))
        out.setdefault(key, []).append(t)
    return out


def kernel_view(t: Tensor, weight: np.ndarray) -> np.ndarray:
    """``to_kernel`` as a view (reshape and transpose, no copy): on a mapped file, copying a
    slice of it reads only the pages that slice covers."""
    if t.n_in is None:
        return weight
    n_out = len(t.kernel) - t.n_in
    split = weight.reshape(t.kernel[t.n_in:] + t.kernel[:t.n_in])  # (out axes..., in axes...)
    return split.transpose((*range(n_out, n_out + t.n_in), *range(n_out)))


def read_leaf(ckpt: Checkpoint, cfg: LlamaConfig, leaf: list[Tensor],
              index: tuple[slice, ...]) -> np.ndarray:
    """``leaf[index]`` (a leaf of ``leaf_tensors``, one device's slice of it) in the file's
    dtype, read by offset: a stacked leaf reads the layers ``index[0]`` names, each layer only
    its slice ``index[1:]``."""
    if not (cfg.scan_layers and leaf[0].layer is not None):
        (t,) = leaf
        return np.array(kernel_view(t, ckpt.mapped(t.hf))[index])
    layers = range(len(leaf))[index[0]]
    return np.stack([np.array(kernel_view(leaf[i], ckpt.mapped(leaf[i].hf))[index[1:]])
                     for i in layers])


def to_tree(read: Callable[[Tensor], np.ndarray], cfg: LlamaConfig) -> dict[str, Any]:
    """The family's parameter tree (nested dicts of numpy, ``cfg.param_dtype``) from ``read``,
    which returns each Hugging Face tensor in its Hugging Face shape."""
    dtype = NP_DTYPES[cfg.param_dtype]
    tree: dict[str, Any] = {}
    stacks: dict[tuple[str, ...], list[np.ndarray]] = {}
    for t in tensors(cfg):
        kernel = to_kernel(t, read(t)).astype(dtype)
        if t.layer is None:
            _put(tree, t.path, kernel)
        elif cfg.scan_layers:
            stacks.setdefault(t.path, []).append(kernel)
        else:
            _put(tree, (f"layer{t.layer}", *t.path), kernel)
    for path, layers in stacks.items():
        _put(tree, ("layers", *path), np.stack(layers))
    return tree


def _put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


# ---------------------------------------------------------------- a model directory


class Checkpoint:
    """A Hugging Face model directory's safetensors, by tensor name (single file or index)."""

    def __init__(self, model_dir: str | Path) -> None:
        self.dir = Path(model_dir)
        files = self._files()
        self.files = {f: SafetensorsFile(self.dir / f) for f in sorted(set(files.values()))}
        self.where = {n: self.files[f] for n, f in files.items()}
        for name in self.where:  # the index must not name tensors its files lack
            if name not in self.where[name]:
                raise HfCheckpointError(f"{self.dir / INDEX} maps {name} to a file without it.",
                                        fix="copy the checkpoint again (a shard is stale)")

    def _files(self) -> dict[str, str]:
        if (self.dir / INDEX).exists():
            try:
                weight_map = json.loads((self.dir / INDEX).read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise HfCheckpointError(f"{self.dir / INDEX} cannot be read ({exc}).",
                                        fix="copy the checkpoint's index again") from None
            return {str(n): str(f) for n, f in weight_map.items()}
        if (self.dir / SINGLE).exists():
            return {n: SINGLE for n in SafetensorsFile(self.dir / SINGLE).entries}
        raise HfCheckpointError(f"{self.dir} has neither {SINGLE} nor {INDEX}.",
                                fix="point at a Hugging Face model directory saved with "
                                    "safetensors (save_pretrained's default)")

    def read(self, name: str, index: Any = ...) -> np.ndarray:
        return self.where[name].read(name, index)

    def mapped(self, name: str) -> np.ndarray:
        return self.where[name].mapped(name)

    def check(self, cfg: LlamaConfig) -> None:
        """Every tensor ``cfg``'s model needs is here with its shape; nothing else is, but
        ``IGNORED`` buffers and a tied checkpoint's copy of the embedding as ``lm_head``."""
        want = {t.hf: t.hf_shape for t in tensors(cfg)}
        for name, shape in want.items():
            if name not in self.where:
                raise HfCheckpointError(f"{self.dir}: no tensor {name}.",
                                        fix="check the checkpoint's tie_word_embeddings and "
                                            "num_hidden_layers against its files")
            got = self.where[name].entries[name].shape
            if got != shape:
                raise HfCheckpointError(f"{self.dir}: {name} is {got}, the model's is {shape}.",
                                        fix="use the config.json saved with these weights")
        extra = [n for n in self.where if n not in want and not n.endswith(IGNORED)
                 and not (cfg.tie_embeddings and n == "lm_head.weight")]
        if extra:
            raise HfCheckpointError(f"{self.dir}: tensors the llama family has no place for: "
                                    f"{', '.join(sorted(extra)[:5])}.",
                                    fix="use a plain LlamaForCausalLM checkpoint")


def load_tree(model_dir: str | Path, cfg: LlamaConfig) -> dict[str, Any]:
    """The whole parameter tree of ``cfg``'s model from the directory (config checked)."""
    check_matches(cfg, read_config(model_dir), source=str(Path(model_dir) / CONFIG))
    ckpt = Checkpoint(model_dir)
    ckpt.check(cfg)
    return to_tree(lambda t: ckpt.read(t.hf), cfg)
