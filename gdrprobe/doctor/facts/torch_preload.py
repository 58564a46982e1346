"""The libnccl a job's torch opens itself, before its libraries ask the loader for one.

PyTorch's ``torch/__init__.py`` (``_load_global_deps``) opens ``torch/lib/libtorch_global_deps.so``
before ``torch._C``. Since its pip wheels took CUDA from the ``nvidia-*`` wheels, when that
fails for want of a CUDA library it preloads each library of its ``cuda_libs`` list (``nccl``:
``libnccl.so.*[0-9]``) from the first ``sys.path`` entry holding ``nvidia/<folder>/lib``, then
retries. Later releases also preload after a success when ``/proc/self/maps`` shows libcudart:
2.6 only nvrtc and nvJitLink (pytorch/pytorch#141063, #145582), later the whole list
(#167046, a missing library ending it), later each library best-effort (#186450); and look
in ``<entry>/<folder>/lib`` and ``nvidia/cuXX/lib`` as well (``_get_cuda_dep_paths``,
#150068, #163661). A library opened this way is already loaded when libtorch_cuda.so asks for
``libnccl.so.2``: glibc hands back the object whose soname matches (``elf/dl-load.c``
_dl_lookup_map) and searches nothing.

Which of these the job's torch does is read from its own ``__init__.py``, parsed, never run:
the ``cuda_libs`` literal, the ``_preload_cuda_deps`` calls of ``_load_global_deps`` on
success and in its ``except`` (string arguments: those libraries; others: the whole list),
``required=False`` on success, the ``libcudart.so`` text its success path looks for, and
whether ``_get_cuda_dep_paths`` exists.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import posixpath
import re

from gdrprobe.sysroot import SysRoot

PRELOAD_CALL = "_preload_cuda_deps"
CUDART_MARK = "libcudart.so"
TORCH_CUDA = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*['"](\d+)\.""", re.M)   # torch/version.py
SOURCE_LIMIT = 1 << 20


@dataclasses.dataclass(frozen=True)
class Preload:
    """What a torch/__init__.py preloads, and when."""

    libraries: tuple[tuple[str, str], ...]   # (folder, file pattern), in its order
    on_failure: bool                         # after libtorch_global_deps.so failed for a CUDA library
    on_success: tuple[tuple[str, str], ...]  # after it loaded, when libcudart is mapped
    success_mark: str | None                 # the text libcudart's path must hold for that
    best_effort: bool                        # on success, a missing library is skipped
    wider: bool                              # also <entry>/<folder>/lib and <entry>/nvidia/cuXX/lib

    def failure_names(self, missing: str) -> bool:
        """Whether the loader's error about ``missing`` names a listed library (its stem)."""
        return any(pattern.split(".", 1)[0] in missing for _, pattern in self.libraries)


def read_preload(source: str | None) -> Preload | None:
    """The preloading a torch/__init__.py does, or None when it does none that can be read."""
    try:
        tree = ast.parse(source or "")
    except (SyntaxError, ValueError):
        return None
    libraries = cuda_libs(tree)
    function = named_function(tree, "_load_global_deps")
    attempt = next((node for node in ast.walk(function) if isinstance(node, ast.Try)), None) if function else None
    if not libraries or attempt is None:
        return None
    success = preload_calls(attempt.body)
    failure = [call for handler in attempt.handlers for call in preload_calls(handler.body)]
    marks = [node.value for statement in attempt.body for node in ast.walk(statement)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and CUDART_MARK in node.value]
    return Preload(libraries, bool(failure),
                   tuple(lib for call in success for lib in called_for(call, libraries)),
                   marks[0] if marks else None,
                   any(keyword.arg == "required" and getattr(keyword.value, "value", True) is False
                       for call in success for keyword in call.keywords),
                   named_function(tree, "_get_cuda_dep_paths") is not None)


def cuda_libs(tree: ast.AST) -> tuple[tuple[str, str], ...]:
    """The first ``cuda_libs`` literal: a dict folder -> pattern, or a list of pairs."""
    for node in ast.walk(tree):
        target = getattr(node, "targets", [getattr(node, "target", None)])
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(name, ast.Name) and name.id == "cuda_libs" for name in target):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError):
                return ()
            pairs = value.items() if isinstance(value, dict) else value
            return tuple((str(folder), str(pattern)) for folder, pattern in pairs)
    return ()


def named_function(tree: ast.AST, name: str) -> ast.FunctionDef | None:
    return next((node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == name), None)


def preload_calls(body: list[ast.stmt]) -> list[ast.Call]:
    return [node for statement in body for node in ast.walk(statement)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == PRELOAD_CALL]


def called_for(call: ast.Call, libraries: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The libraries one call preloads: the two strings it names, else the whole list."""
    named = [arg.value for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    return ((named[0], named[1]),) if len(named) >= 2 else libraries


def cuda_major(root: SysRoot, torch_dir: str) -> str | None:
    """The CUDA major version torch was built for (``torch/version.py``)."""
    match = TORCH_CUDA.search(root.read(posixpath.join(torch_dir, "version.py")) or "")
    return match.group(1) if match else None


def first_match(root: SysRoot, sites: list[str], folder: str, pattern: str, preload: Preload,
                major: str | None) -> str | None:
    """The file torch's preloading takes for one library: the first sys.path entry's."""
    for site in sites:
        folders = [f"nvidia/{folder}/lib"]
        if preload.wider:
            folders += ([f"nvidia/cu{major}/lib"] if major else []) + [f"{folder}/lib"]
        for directory in (posixpath.join(site, name) for name in folders):
            names = [name for name in root.listdir(directory) if fnmatch.fnmatchcase(name, pattern)]
            if names:
                return posixpath.join(directory, names[0])
    return None


def preloaded_nccl(root: SysRoot, sites: list[str], libraries: tuple[tuple[str, str], ...], required: bool,
                   preload: Preload, major: str | None) -> str | None:
    """The libnccl preloaded by going through ``libraries`` in order (a missing required
    library ends the preloading, torch raising before it reaches libnccl)."""
    for folder, pattern in libraries:
        path = first_match(root, sites, folder, pattern, preload, major)
        if path is None and required:
            return None
        if path is not None and pattern.startswith("libnccl"):
            return path
    return None
