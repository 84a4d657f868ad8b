"""ONNX Runtime execution providers and their options from a short spec string.

The CLI's ``--runner`` takes specs such as::

    ort:cpu
    ort:cuda,tf32=0
    ort:cuda,device=1,conv_algo_search=heuristic
    ort:tensorrt,fp16=1,layer_norm_fp32_fallback=1,engine_cache=1

``parse_ort_spec`` turns one into an :class:`OrtSpec`; ``ort_providers`` returns the
``(providers, provider_options)`` pair that ``onnxruntime.InferenceSession`` and ``OrtRunner``
take. GPU providers always get ``CPUExecutionProvider`` appended as the last fallback (ONNX
Runtime does that anyway); the TensorRT EP also gets ``CUDAExecutionProvider`` before it, as the
ONNX Runtime docs recommend, for nodes TensorRT does not take. ``OrtRunner`` still raises when
the *first* provider is not the one that runs.

Option names come from the ONNX Runtime documentation:

- CUDA EP: https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html
- TensorRT EP: https://onnxruntime.ai/docs/execution-providers/TensorRT-ExecutionProvider.html

and were checked against the option strings compiled into ``onnxruntime-gpu==1.31.1``
(``libonnxruntime_providers_{cuda,tensorrt}.so`` and the Python binding). That binding parses the
TensorRT EP's boolean options only as ``'True'``/``'False'`` ("The value for the key
'trt_fp16_enable' should be 'True' or 'False'"), while the CUDA EP's booleans are parsed from
``'0'``/``'1'``; values are normalized accordingly. Options whose value holds a comma (the
``trt_profile_*_shapes``) or a raw pointer (``user_compute_stream``) cannot be written in a spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from precision_doctor.errors import BackendError
from precision_doctor.runners.ort import resolve_provider

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

# Option name -> kind: "bool", "int", "str", or the tuple of allowed enum values.
CUDA_OPTIONS: dict[str, Any] = {
    "device_id": "int",
    "gpu_mem_limit": "int",
    "arena_extend_strategy": ("kNextPowerOfTwo", "kSameAsRequested"),
    "cudnn_conv_algo_search": ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
    "do_copy_in_default_stream": "bool",
    "cudnn_conv_use_max_workspace": "bool",
    "cudnn_conv1d_pad_to_nc1d": "bool",
    "enable_cuda_graph": "bool",
    "enable_skip_layer_norm_strict_mode": "bool",
    "prefer_nhwc": "bool",
    "use_ep_level_unified_stream": "bool",
    "use_tf32": "bool",
    "fuse_conv_bias": "bool",
    "sdpa_kernel": "int",
    "tunable_op_enable": "bool",
    "tunable_op_tuning_enable": "bool",
    "tunable_op_max_tuning_duration_ms": "int",
}

TENSORRT_OPTIONS: dict[str, Any] = {
    "device_id": "int",
    "trt_max_workspace_size": "int",
    "trt_max_partition_iterations": "int",
    "trt_min_subgraph_size": "int",
    "trt_fp16_enable": "bool",
    "trt_bf16_enable": "bool",
    "trt_int8_enable": "bool",
    "trt_int8_calibration_table_name": "str",
    "trt_int8_use_native_calibration_table": "bool",
    "trt_layer_norm_fp32_fallback": "bool",
    "trt_dla_enable": "bool",
    "trt_dla_core": "int",
    "trt_dump_subgraphs": "bool",
    "trt_engine_cache_enable": "bool",
    "trt_engine_cache_path": "str",
    "trt_engine_cache_prefix": "str",
    "trt_timing_cache_enable": "bool",
    "trt_timing_cache_path": "str",
    "trt_force_timing_cache": "bool",
    "trt_detailed_build_log": "bool",
    "trt_build_heuristics_enable": "bool",
    "trt_sparsity_enable": "bool",
    "trt_builder_optimization_level": "int",
    "trt_auxiliary_streams": "int",
    "trt_tactic_sources": "str",
    "trt_extra_plugin_lib_paths": "str",
    "trt_force_sequential_engine_build": "bool",
    "trt_context_memory_sharing_enable": "bool",
    "trt_cuda_graph_enable": "bool",
    "trt_engine_hw_compatible": "bool",
    "trt_weight_stripped_engine_enable": "bool",
}

_TABLES: dict[str, dict[str, Any]] = {CPU: {}, CUDA: CUDA_OPTIONS, TENSORRT: TENSORRT_OPTIONS}
# Short spellings: a key is tried as written, then with these prefixes/suffixes.
_FORMS = {CUDA: ("{}", "use_{}", "enable_{}", "cudnn_{}", "gpu_{}", "{}_id"),
          TENSORRT: ("{}", "trt_{}", "trt_{}_enable", "{}_id")}
_BOOL_WORDS = {CUDA: ("1", "0"), TENSORRT: ("True", "False")}


@dataclass(frozen=True)
class OrtSpec:
    """One parsed ``ort:<provider>,key=value,...`` spec.

    Attributes:
        provider: ONNX Runtime provider name (``CUDAExecutionProvider``).
        options: Canonical option name -> value string, in the order written.
        spec: The spec as the user wrote it (for reports).
    """

    provider: str
    options: tuple[tuple[str, str], ...]
    spec: str

    @property
    def label(self) -> str:
        """Runner label for reports, e.g. ``ort-cuda-use_tf32=0``."""
        short = self.provider.replace("ExecutionProvider", "").lower()
        return "-".join(["ort", short] + [f"{k}={v}" for k, v in self.options])

    def providers(self) -> list[str]:
        """Providers in priority order, CPU last (``[CUDA..., CPU...]``)."""
        chain = [self.provider]
        if self.provider == TENSORRT:
            chain.append(CUDA)
        if self.provider != CPU:
            chain.append(CPU)
        return chain

    def provider_options(self) -> list[dict[str, str]]:
        """One options dict per entry of ``providers()``.

        The CUDA EP placed after the TensorRT EP gets the same ``device_id``.
        """
        own = dict(self.options)
        dicts = [own]
        if self.provider == TENSORRT:
            dicts.append({"device_id": own["device_id"]} if "device_id" in own else {})
        if self.provider != CPU:
            dicts.append({})
        return dicts

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"provider": self.provider, "options": dict(self.options), "spec": self.spec}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OrtSpec:
        """Inverse of ``to_dict``."""
        return cls(str(data["provider"]),
                   tuple((str(k), str(v)) for k, v in dict(data["options"]).items()),
                   str(data["spec"]))


def parse_ort_spec(spec: str) -> OrtSpec:
    """Parse ``ort:<provider>[,key=value]...`` (the ``ort:`` prefix is optional).

    Keys may be the documented ONNX Runtime names (``use_tf32``, ``trt_fp16_enable``) or short
    forms: CUDA tries ``key``, ``use_key``, ``enable_key``, ``cudnn_key``, ``gpu_key``,
    ``key_id``; TensorRT tries ``key``, ``trt_key``, ``trt_key_enable``, ``key_id``. A key
    without ``=`` means ``key=1``. Booleans accept 1/0/true/false/yes/no/on/off.

    Args:
        spec: e.g. ``"ort:cuda,tf32=0"`` or ``"ort:tensorrt,fp16=1"``.

    Returns:
        The parsed spec; ``.providers()`` and ``.provider_options()`` feed ``OrtRunner``.

    Raises:
        BackendError: Unknown provider, unknown or repeated option (the message lists the valid
            options), or a value of the wrong kind.
    """
    text = spec.strip()
    head, sep, rest = text.partition(":")
    if sep and head.strip().lower() != "ort":
        raise BackendError(f"runner spec {spec!r} is not an ONNX Runtime spec: it must start "
                           "with 'ort:' (e.g. 'ort:cuda,tf32=0')", spec=spec)
    parts = [p.strip() for p in (rest if sep else text).split(",")]
    if not parts[0]:
        raise BackendError(f"runner spec {spec!r} names no execution provider; write e.g. "
                           "'ort:cpu', 'ort:cuda,tf32=0' or 'ort:tensorrt,fp16=1'", spec=spec)
    provider = resolve_provider(parts[0])
    table = _TABLES.get(provider)
    options: dict[str, str] = {}
    for item in parts[1:]:
        if not item:
            continue
        key, eq, value = item.partition("=")
        key, value = key.strip(), (value.strip() if eq else "1")
        name = _canonical(provider, table, key, spec)
        if name in options:
            raise BackendError(f"runner spec {spec!r} sets option {name!r} twice", spec=spec,
                               option=name)
        options[name] = _normalize(provider, table, name, value, spec)
    return OrtSpec(provider, tuple(options.items()), spec)


def ort_providers(spec: str) -> tuple[list[str], list[dict[str, str]]]:
    """``(providers, provider_options)`` for ``OrtRunner`` from a spec string.

    Example: ``ort_providers("ort:cuda,tf32=0")`` ->
    ``(["CUDAExecutionProvider", "CPUExecutionProvider"], [{"use_tf32": "0"}, {}])``.

    Raises:
        BackendError: See ``parse_ort_spec``.
    """
    parsed = parse_ort_spec(spec)
    return parsed.providers(), parsed.provider_options()


def valid_options(provider: str) -> list[str]:
    """Sorted option names this module accepts for ``provider`` (short or full name).

    Returns an empty list for providers whose options are passed through unchecked.
    """
    return sorted(_TABLES.get(resolve_provider(provider), {}))


def _canonical(provider: str, table: dict[str, Any] | None, key: str, spec: str) -> str:
    if table is None:  # a provider we have no table for: pass the option through unchecked
        return key
    for form in _FORMS.get(provider, ("{}",)):
        if form.format(key) in table:
            return form.format(key)
    valid = ", ".join(sorted(table)) or "(none)"
    raise BackendError(f"runner spec {spec!r}: {provider} has no option {key!r}; valid options: "
                       f"{valid}", spec=spec, option=key, provider=provider)


def _normalize(provider: str, table: dict[str, Any] | None, name: str, value: str,
               spec: str) -> str:
    kind = "str" if table is None else table[name]
    if kind == "bool":
        on, off = _BOOL_WORDS.get(provider, ("1", "0"))
        if value.lower() in _TRUE:
            return on
        if value.lower() in _FALSE:
            return off
        raise BackendError(f"runner spec {spec!r}: option {name!r} is a boolean; use 1 or 0, "
                           f"not {value!r}", spec=spec, option=name)
    if kind == "int":
        try:
            return str(int(value.replace("_", ""), 0))
        except ValueError:
            raise BackendError(f"runner spec {spec!r}: option {name!r} takes an integer, not "
                               f"{value!r}", spec=spec, option=name) from None
    if isinstance(kind, tuple):
        for allowed in kind:
            if allowed.lower() == value.lower():
                return allowed
        raise BackendError(f"runner spec {spec!r}: option {name!r} takes one of "
                           f"{', '.join(kind)}, not {value!r}", spec=spec, option=name)
    return value
