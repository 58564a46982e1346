"""Validating a located verbs handle never crashes: a pointer that leads nowhere readable
is an error value. Each probe of a bogus pointer runs in a child process, so a build that
still loads through the pointer fails the test instead of ending the test run."""

import ctypes
import errno
import subprocess
import sys
import textwrap
import types

import pytest

from gdrprobe import _native
from gdrprobe.errors import SCHEDULER_ACTION, ExitCode, GdrprobeError, NotTestable
from gdrprobe.rdma import handles

# Addresses no readable memory lies at: the NULL page, a mapping just unmapped (a dangling
# pointer), and a page whose protection forbids reading (a guard page).
BOGUS_POINTERS = """
import ctypes, mmap
from gdrprobe import _native

gone = _native.HostBuffer(mmap.PAGESIZE)
gone_address = gone.address
gone.close()
guard = _native.HostBuffer(mmap.PAGESIZE)
assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(guard.address), mmap.PAGESIZE, 0) == 0
BOGUS = {"null": 0, "unmapped": gone_address, "guard page": guard.address}
"""


def run_isolated(code: str) -> str:
    """stdout of code run by a child Python; the test fails if the child crashed."""
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == 0, f"the child ended with {child.returncode}: {child.stderr}"
    return child.stdout


def test_reading_fields_through_a_bogus_pointer_raises_efault():
    out = run_isolated(BOGUS_POINTERS + """
for reader in (_native.qp_fields, _native.cq_fields):
    for name, pointer in BOGUS.items():
        try:
            reader(pointer)
            print(reader.__name__, name, "read")
        except OSError as error:
            print(reader.__name__, name, error.errno)
""")
    assert out.split("\n")[:-1] == [f"{reader} {name} {errno.EFAULT}"
                                    for reader in ("qp_fields", "cq_fields")
                                    for name in ("null", "unmapped", "guard page")]


def test_checking_a_bogus_handle_is_not_testable_naming_the_fix():
    """A layout gdrprobe does not know is gdrprobe's limitation: exit 9 (warn), never the
    drain of a failed verbs call (6)."""
    out = run_isolated(BOGUS_POINTERS + """
from types import SimpleNamespace
from gdrprobe.errors import NotTestable
from gdrprobe.rdma import handles

for name, pointer in BOGUS.items():
    for check in (lambda: handles.check_qp(pointer, SimpleNamespace(qp_num=7), 0x1000),
                  lambda: handles.check_cq(pointer, SimpleNamespace(cqe=16))):
        try:
            check()
        except NotTestable as error:
            print(error.cause, "|", error.fix == handles.FIX, int(error.exit_code))
""")
    assert out.count("is not readable memory | True 9") == 6
    assert out.count("the located ibv_qp") == 3 and out.count("the located ibv_cq") == 3


def test_a_readable_pointer_with_the_wrong_contents_does_not_match():
    zeros = ctypes.create_string_buffer(1024)
    address = ctypes.addressof(zeros)
    with pytest.raises(NotTestable, match="ibv_qp does not match its pyverbs QP") as raised:
        handles.check_qp(address, types.SimpleNamespace(qp_num=7), 0x1000)
    assert raised.value.exit_code == ExitCode.NOT_TESTABLE
    assert raised.value.cause.startswith("not testable: gdrprobe cannot use this pyverbs")
    with pytest.raises(NotTestable, match="ibv_cq does not match its pyverbs CQ"):
        handles.check_cq(address, types.SimpleNamespace(cqe=16))


def test_a_slot_outside_the_object_is_never_read():
    out = run_isolated("""
from gdrprobe import _native

for offset in (1 << 40, -8, object.__basicsize__ - 7):
    try:
        _native.object_slot(object(), offset)
        print("read")
    except ValueError as error:
        print(error)
""")
    assert out.split("\n")[:-1] == [
        f"offset {offset} is outside the 16-byte C struct of type object"
        for offset in (1 << 40, -8, 9)]
    assert _native.object_slot(object(), 8) == id(object)   # ob_type, the last word inside


def test_an_object_smaller_than_its_pointer_field_is_refused(monkeypatch):
    base = types.SimpleNamespace(PyverbsCM=types.SimpleNamespace(__basicsize__=1 << 20))
    monkeypatch.setattr(handles.verbs, "pyverbs", lambda: types.SimpleNamespace(base=base))
    with pytest.raises(NotTestable, match="smaller than its pointer field"):
        handles.layout_pointer(object(), object)


def test_an_object_of_the_wrong_kind_is_a_bug_in_gdrprobe_not_a_node_fault():
    with pytest.raises(GdrprobeError, match="expected a pyverbs int, got object") as raised:
        handles.layout_pointer(object(), int)
    assert raised.value.exit_code == ExitCode.INTERNAL
    assert SCHEDULER_ACTION[raised.value.exit_code] == "warn"


def peek_through_pipe(address: int, length: int) -> tuple[int, bytes]:
    """The fallback of gdr_peek (where process_vm_readv is refused), called directly."""
    library = ctypes.CDLL(_native.__file__)
    into = ctypes.create_string_buffer(length)
    err = library.gdr_peek_through_pipe(into, ctypes.c_void_p(address), ctypes.c_size_t(length))
    return err, into.raw


def test_the_pipe_fallback_reads_memory_and_reports_a_bad_address():
    source = ctypes.create_string_buffer(b"ibv_qp?", 64)
    assert peek_through_pipe(ctypes.addressof(source), 64) == (0, source.raw)
    assert peek_through_pipe(0, 64)[0] == errno.EFAULT
    assert peek_through_pipe(ctypes.addressof(source), 4097)[0] == errno.EINVAL
