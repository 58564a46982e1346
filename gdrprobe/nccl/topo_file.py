"""NCCL's topology file: which file NCCL reads, how its own XML parser reads it, and where
the file puts each GPU and NIC NCCL detects. Pure: the text and the sysfs facts are handed in.

Which file (``src/graph/topo.cc`` ncclTopoGetSystem, NVIDIA/nccl 2.30.7): ``NCCL_TOPO_FILE``
from the environment or NCCL's configuration files (:func:`gdrprobe.nccl.env.with_conf_files`),
set even to "", else ``/var/run/nvidia-topologyd/virtualTopology.xml`` (from 2.10.3). A file
``fopen`` cannot open is skipped and NCCL detects everything from sysfs, logged only when
NCCL_TOPO_FILE named it (``src/graph/xml.cc`` ncclTopoGetXmlFromFile: WARN before 2.27.3,
INFO from 2.27.3); a file it opens but cannot parse fails the communicator's init.

The parser (xml.cc xmlGetNode, xmlGetToken, xmlGetValue, xmlLoadSub) is not an XML parser:
it knows no entities, no declarations and no character data, so ``&amp;`` stays five
characters, ``<?xml ...?>`` and a tab between attributes are errors, and elements other than
system, cpu, pci, gpu, nic, net, nvlink, c2c and pcilink in their places are skipped with
what they hold; a name or value ends at a NUL byte, as C compares it. This module follows it
character by character, once over the text (linear, no recursion), within NCCL's limits: a
name or value of 254 characters or more fails (before 2.27.3 a value that long overflows
NCCL's buffer instead: reported as the same failure), 16 attributes kept per element, 256
elements (1024 before 2.21.5), 640 children per element (128 from 2.21.5; 32 before,
unchecked: more overflow NCCL's array, reported as a failure). gdrprobe reads at most
:data:`MAX_FILE_BYTES` of a file and judges none longer.

Where a device goes (xml.cc ncclTopoFillGpu, ncclTopoFillNet, ncclTopoGetPciNode,
ncclTopoGetXmlFromSys): a NIC whose name is a ``<net name=...>`` in the file sits where that
net sits; a device whose bus id is a ``<pci busid=...>`` (compared exactly; the first in
the file) keeps the file's parents; else NCCL climbs sysfs switch by switch until a switch
the file has (whose parents it then keeps) or the root complex, where it joins the CPU of
the device's NUMA node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from gdrprobe.nccl import params
from gdrprobe.nccl.cparse import INT64_MAX, c_int, strtoll
from gdrprobe.nccl.versions import Version

VIRTUAL_TOPOLOGY_FILE = "/var/run/nvidia-topologyd/virtualTopology.xml"
VIRTUAL_TOPOLOGY_SINCE: Version = (2, 10, 3)     # topo.cc: the default path
OPEN_FAILURE_INFO_SINCE: Version = (2, 27, 3)    # xml.cc: "Could not open" logged as INFO, WARN before
SINGLE_QUOTES_SINCE: Version = (2, 27, 3)        # xml.cc xmlGetValue: '...' as well as "..."
NODES_256_SINCE: Version = (2, 21, 5)            # topo.h NCCL_TOPO_XML_MAX_NODES; xml.h MAX_NODES 1024 before
SUBS_640_SINCE: Version = (2, 29, 7)             # xml.h MAX_SUBS 640; 128 from 2.21.5, 32 before
MAX_FILE_BYTES = 1 << 20                         # gdrprobe's cap (also what a capture copies of a file)
MAX_STR_LEN = 255                                # xml.h: a name or value buffer, with its NUL
MAX_ATTR_COUNT = 16
TOPO_XML_VERSION = 1                             # xml.h NCCL_TOPO_XML_VERSION
BLANKS = " \n\r"                                 # what xmlGetNode skips between elements
TOKEN_ENDS = " >/\n\r"

# Which elements xmlLoadSub hands to a handler, by the parent's name ("" is the top level).
CHILDREN = {"": ("system",), "system": ("cpu",), "cpu": ("pci", "nic"),
            "pci": ("pci", "gpu", "nic", "pcilink"), "gpu": ("nvlink", "c2c"), "nic": ("net",)}
OPEN, CLOSE, SINGLE = "open", "close", "single"


def c_long_int(text: str) -> int:
    """``int x = strtol(text, NULL, 0)``: saturated at LONG_MAX, then cut to an int."""
    number = strtoll(text)
    return c_int(INT64_MAX if number is None else number)


def c_string(text: str) -> str:
    """What C's string functions see of a buffer: up to its first NUL."""
    return text.split("\x00", 1)[0]


class TopoFileError(ValueError):
    """What makes NCCL fail on the file: its WARN line, and the result its init returns."""

    def __init__(self, message: str, result: str = "ncclInternalError"):
        super().__init__(message)
        self.message = message
        self.result = result


# ---- which file ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TopoFileSetting:
    path: str
    origin: str                    # "environment", a configuration file's path, or "default"

    @property
    def named(self) -> bool:
        """Whether NCCL_TOPO_FILE names it (NCCL then logs a file it cannot open)."""
        return self.origin != "default"

    def describe(self) -> str:
        if not self.named:
            return f"{self.path} (NCCL's default path, NCCL_TOPO_FILE being unset)"
        where = "the environment" if self.origin == "environment" else self.origin
        return f"{self.path} (NCCL_TOPO_FILE in {where})"


def topo_file_setting(environ: Mapping[str, str], origin: str, version: Version) -> TopoFileSetting | None:
    """The file NCCL reads (topo.cc ncclTopoGetSystem); ``origin``: where NCCL_TOPO_FILE
    comes from. None: no file is looked for (an NCCL before 2.10.3 without the variable)."""
    if params.TOPO_FILE.is_set(environ):
        return TopoFileSetting(params.TOPO_FILE.raw(environ), origin)
    if version >= VIRTUAL_TOPOLOGY_SINCE:
        return TopoFileSetting(VIRTUAL_TOPOLOGY_FILE, "default")
    return None


# ---- the parser ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Dialect:
    """What the parser of one NCCL release accepts."""

    max_nodes: int
    max_subs: int
    quotes: str

    @classmethod
    def of(cls, version: Version) -> Dialect:
        subs = 640 if version >= SUBS_640_SINCE else 128 if version >= NODES_256_SINCE else 32
        return cls(max_nodes=256 if version >= NODES_256_SINCE else 1024, max_subs=subs,
                   quotes="\"'" if version >= SINGLE_QUOTES_SINCE else "\"")


@dataclasses.dataclass(eq=False)
class Element:
    """One element NCCL keeps: its name, its attributes (the first of a repeated key wins,
    as xmlGetAttrIndex finds it), its parent and children."""

    name: str
    kind: str
    attrs: dict[str, str]
    parent: Element | None = dataclasses.field(default=None, repr=False)
    subs: list[Element] = dataclasses.field(default_factory=list)

    def sub(self, name: str) -> Element | None:
        return next((sub for sub in self.subs if sub.name == name), None)


class _Parser:
    def __init__(self, text: str, dialect: Dialect):
        self.text, self.pos, self.dialect = text, 0, dialect
        self.kept: list[Element] = []

    def char(self) -> str:
        """xmlGetChar: the next character; the end of the file here is an error."""
        if self.pos >= len(self.text):
            raise TopoFileError("XML Parse : Unexpected EOF")
        self.pos += 1
        return self.text[self.pos - 1]

    def value(self) -> tuple[str, str]:
        """xmlGetValue: a quoted value and the character after it. NCCL stores the closing
        quote too, and fails when it would store a 255th character (before 2.27.3 it
        overflows its buffer instead)."""
        quote = self.char()
        if quote not in self.dialect.quotes:
            raise TopoFileError("XML Parse : Expected (double) quote.")
        end = self.text.find(quote, self.pos)
        stored = end + 1 - self.pos if end >= 0 else len(self.text) - self.pos
        if stored >= MAX_STR_LEN:
            raise TopoFileError(f"Error : value {self.text[self.pos:self.pos + MAX_STR_LEN - 1]} "
                                f"too long (max {MAX_STR_LEN})")
        if end < 0:
            raise TopoFileError("XML Parse : Unexpected EOF")
        value, self.pos = self.text[self.pos:end], end + 1
        return c_string(value), self.char()

    def token(self, with_value: bool) -> tuple[str, str, str]:
        """xmlGetToken: a name up to a blank, '>', '/' or a line end (that character is the
        third item), or up to '=' and then its value."""
        start = self.pos
        while True:
            char = self.char()
            if char == "=":
                name = c_string(self.text[start:self.pos - 1])
                if not with_value:
                    raise TopoFileError(f"XML Parse : Unexpected value with name {name}")
                return (name, *self.value())
            if self.pos - 1 - start == MAX_STR_LEN - 1:
                raise TopoFileError(f"Error : name {self.text[start:self.pos - 1]} too long (max {MAX_STR_LEN})")
            if char in TOKEN_ENDS:
                return c_string(self.text[start:self.pos - 1]), "", char

    def skip_comment(self, read: str) -> None:
        """xmlSkipComment: on to the first "-->", the characters the name token read (after
        "<!--", with the one that ended it) counting as read."""
        window = ("..." + read)[-3:]
        straddling = window + self.text[self.pos:self.pos + 2]
        for offset in range(len(straddling) - 2):
            if straddling[offset:offset + 3] == "-->":
                self.pos += offset
                return
        end = self.text.find("-->", self.pos)
        if end < 0:
            raise TopoFileError("XML Parse error : unterminated comment")
        self.pos = end + 3

    def node(self) -> tuple[str, str, dict[str, str]] | None:
        """xmlGetNode: the next element or closing tag, comments skipped; None at the end."""
        while True:
            char = " "
            while char in BLANKS:
                if self.pos >= len(self.text):
                    return None
                char = self.char()
            if char != "<":
                raise TopoFileError(f"XML Parse error : expecting '<', got '{char}'")
            name, _, char = self.token(False)
            if not name.startswith("!--"):
                break
            self.skip_comment(name[3:] + char)
        if name == "" and char == "/":
            name, _, char = self.token(False)
            if char != ">":
                raise TopoFileError(f"XML Parse error : unexpected trailing {char} in closing tag {name}")
            return name, CLOSE, {}
        attrs: dict[str, str] = {}
        count = 0
        while char == " ":
            key, value, char = self.token(True)
            if count < MAX_ATTR_COUNT:      # further ones are read and dropped
                attrs.setdefault(key, value)
                count += 1
        kind = OPEN
        if char == "/":
            kind = SINGLE
            _, _, char = self.token(False)
        if char != ">":
            raise TopoFileError(f"XML Parse : expected >, got '{char}'")
        return name, kind, attrs

    def next_node(self) -> tuple[str, str, dict[str, str]] | None:
        """xmlLoadSub checks the element count before every read."""
        if len(self.kept) == self.dialect.max_nodes:
            raise TopoFileError(f"Error : XML parser is limited to {self.dialect.max_nodes} nodes")
        return self.node()

    def skip(self, name: str, kind: str) -> None:
        """An element no handler takes: what it holds is read and dropped. NCCL reads it into
        the slot it reads the element into, so any closing tag ends it (names unchecked)."""
        depth = 0 if kind == SINGLE else 1
        while depth:
            found = self.next_node()
            if found is None:
                raise TopoFileError(f"XML Parse : unterminated {name}")
            depth += {OPEN: 1, CLOSE: -1, SINGLE: 0}[found[1]]

    def parse(self) -> list[Element]:
        """xmlLoadSub from the top, one frame per element being read."""
        stack: list[Element | None] = [None]
        while stack:
            head = stack[-1]
            found = self.next_node()
            if found is None:
                if head is not None:
                    raise TopoFileError(f"XML Parse : unterminated {head.name}")
                break
            name, kind, attrs = found
            if head is not None and kind == CLOSE:
                if name != head.name:
                    raise TopoFileError(f"XML Mismatch : {head.name} / {name}")
                stack.pop()
                continue
            if name not in CHILDREN.get(head.name if head else "", ()):
                self.skip(name, kind)
                continue
            stack += self.keep(Element(name, kind, attrs, head))
        return self.kept

    def keep(self, element: Element) -> list[Element]:
        head = element.parent
        if head is not None:
            if len(head.subs) == self.dialect.max_subs:
                raise TopoFileError(f"Error : XML parser is limited to {self.dialect.max_subs} subnodes")
            head.subs.append(element)
        self.kept.append(element)
        if element.name == "system":
            check_system(element)
        return [] if element.kind == SINGLE else [element]


def check_system(system: Element) -> None:
    """xml.cc ncclTopoXmlLoadSystem: version must be there and read (strtol into an int) as 1."""
    if "version" not in system.attrs:
        raise TopoFileError("Attribute version of node system not found")
    version = c_long_int(system.attrs["version"])
    if version != TOPO_XML_VERSION:
        raise TopoFileError(f"XML Topology has wrong version {version}, {TOPO_XML_VERSION} needed",
                            "ncclInvalidUsage")


# ---- what NCCL keeps of the file -------------------------------------------------------------


class OversizedFile(ValueError):
    """Longer than gdrprobe reads (:data:`MAX_FILE_BYTES`): what NCCL makes of it is not judged."""


class TopologyXml:
    """The elements NCCL keeps of a topology file, found as xml.h xmlFindTagKv finds them:
    the first in the file's order."""

    def __init__(self, elements: list[Element]):
        self.elements = elements
        self._pci: dict[str, Element] = {}
        self._net: dict[str, Element] = {}
        for element in elements:
            if element.name == "pci" and "busid" in element.attrs:
                self._pci.setdefault(element.attrs["busid"], element)
            if element.name == "net" and "name" in element.attrs:
                self._net.setdefault(element.attrs["name"], element)

    @property
    def has_system(self) -> bool:
        """Without a <system>, NCCL makes its own and reads everything from sysfs."""
        return bool(self.elements)

    def pci(self, bus_id: str) -> Element | None:
        return self._pci.get(bus_id)

    def net(self, name: str) -> Element | None:
        return self._net.get(name)


def parse_topology(text: str, version: Version) -> TopologyXml:
    """The file as the parser of NCCL ``version`` reads it (xml.cc ncclTopoGetXmlFromFile);
    TopoFileError where that NCCL fails on it. ``text``: the file's bytes decoded as
    latin-1, one character per byte, as NCCL reads them."""
    if len(text) >= MAX_FILE_BYTES:
        raise OversizedFile(f"{len(text)} bytes or more, gdrprobe reads less than {MAX_FILE_BYTES}")
    return TopologyXml(_Parser(text, Dialect.of(version)).parse())


# ---- where NCCL puts a device ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where NCCL puts a device its topology file has a say on."""

    parents: tuple[str, ...]                      # NCCL's PCI switches above it, nearest first
    numaid: str                                   # the <cpu numaid=...> it hangs off
    how: str                                      # how the file reached it, for the report
    own: Mapping[str, str] = dataclasses.field(default_factory=dict)   # its own <pci> in the file
    from_file: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)  # parents the file holds
    gpu: Mapping[str, str] = dataclasses.field(default_factory=dict)   # the file's <gpu> under its <pci>

    @property
    def numa_node(self) -> int:
        """The CPU as ncclTopoAddCpu numbers it (xmlGetAttrInt: strtol into an int)."""
        return c_long_int(self.numaid)

    def describe(self) -> str:
        above = f"under {', then '.join(self.parents)}" if self.parents else "straight on its CPU"
        return f"{above}, CPU numaid {self.numaid} (matched by {self.how})"


def cpu_numaid(cpu: Element) -> str:
    """xml.cc ncclTopoGetXmlFromCpu and topo.cc ncclTopoAddCpu both need the numaid."""
    if "numaid" in cpu.attrs:
        return cpu.attrs["numaid"]
    if "affinity" in cpu.attrs:
        raise TopoFileError("Attribute numaid of node cpu not found")
    raise TopoFileError("GetXmlFromCpu : could not find CPU numa ID.")


def file_ancestry(element: Element, in_sysfs: Collection[str]) -> tuple[list[Element], str]:
    """The <pci> elements above one (nearest first) and their <cpu>'s numaid. Each needs
    a bus id and a class (topo.cc ncclTopoAddPci), the class from sysfs where the bus id is
    a device there (xml.cc ncclTopoGetXmlFromSys), else from the file."""
    parents = []
    node = element.parent
    while node is not None and node.name == "pci":
        busid = node.attrs.get("busid")
        if busid is None:
            raise TopoFileError("Attribute busid of node pci not found")
        if "class" not in node.attrs and busid not in in_sysfs:
            raise TopoFileError("Attribute class of node pci not found")
        parents.append(node)
        node = node.parent
    return parents, cpu_numaid(node)


def placement_at(element: Element, in_sysfs: Collection[str], how: str,
                 climbed: tuple[str, ...] = ()) -> Placement:
    """A device whose own node is ``element`` (a <pci>, or the <cpu> a NIC hangs off), or
    (``climbed`` non-empty) that NCCL climbed sysfs to from below it."""
    if element.name == "cpu":
        return Placement((), cpu_numaid(element), how)
    parents, numaid = file_ancestry(element, in_sysfs)
    above = {node.attrs["busid"]: node.attrs for node in parents}
    if climbed:
        return Placement(climbed + tuple(above), numaid, how,
                         from_file={climbed[-1]: element.attrs, **above})
    gpu = element.sub("gpu")
    return Placement(tuple(above), numaid, how, own=element.attrs, from_file=above,
                     gpu=gpu.attrs if gpu else {})


def place_device(xml: TopologyXml, bus_id: str, sysfs_parents: tuple[str, ...],
                 in_sysfs: Collection[str], net_name: str | None = None) -> Placement | None:
    """Where NCCL puts a GPU (``bus_id`` as CUDA names it) or a NIC (``net_name`` its
    device name, ``bus_id`` the function NCCL's IB transport names), given the switches
    above it in sysfs (``sysfs_parents``, nearest first: :func:`gdrprobe.nccl.topo.pci_parents`)
    and the bus ids sysfs has; None where the file has no say (NCCL reads sysfs alone)."""
    net = xml.net(net_name) if net_name is not None else None
    if net is not None:
        # xml.cc ncclTopoFillNet: the <net> sits in a <nic>, in a <pci> or a <cpu>.
        return placement_at(net.parent.parent, in_sysfs, f"its net name {net_name}")
    own = xml.pci(bus_id)
    if own is not None:
        return placement_at(own, in_sysfs, f"its bus id {bus_id}")
    for depth, parent in enumerate(sysfs_parents):
        node = xml.pci(parent)
        if node is not None:
            return placement_at(node, in_sysfs, f"switch {parent} above it in sysfs",
                                sysfs_parents[:depth + 1])
    return None
