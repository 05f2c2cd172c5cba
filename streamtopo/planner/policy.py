"""What a platform lets its tenants choose, and why a choice is refused.

A :class:`PlatformPolicy` comes from the chart's values (the operator's environment) and is handed to
the model's validators as their context (:data:`POLICY`), so the CLI, the admission webhook and the
reconcile refuse the same things with the same words. No policy (a local run) means the user runs
their own code and images.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, unquote, urlsplit


@dataclass(frozen=True)
class PlatformPolicy:
    """What a platform lets its tenants choose (the chart's ``executor`` values), given to validation as
    its context; no policy (a local run) means the user runs their own code and images."""

    udf_modules: tuple[str, ...] = ()
    """Modules UDFs may come from, with their submodules; empty: no UDFs."""
    images: tuple[str, ...] = ()
    """Image name prefixes ``spec.image`` may use besides the platform's runtime image (the spec's
    default); empty: only that image."""
    shared_streams: tuple[str, ...] = ()
    """``<namespace>/<name>`` streams any topology may read (read only) from another namespace; empty:
    named streams are namespace-local."""
    prometheus_urls: tuple[str, ...] = ()
    """URLs a topology's own Prometheus may be (the operator sends requests there from inside the cluster,
    so an open choice would let a tenant reach any internal service): the same scheme, host and port,
    and a path at or under the listed one (:func:`url_problem`); empty: none."""
    max_executors: int | None = None
    """The most executors one topology may ask for (``autoscaling.maxExecutors``, ``replicas``);
    None: the model's own bound."""
    max_key_groups: int | None = None
    """The most key groups of one operator (``keyGroups``, per operator or topology-wide)."""
    max_operators: int | None = None
    """The most operators of one topology."""
    node_keys: tuple[str, ...] = ()
    """Node label and taint keys tenants may select on and tolerate (a key, or a prefix ending in ``/``);
    empty: any key but the cluster's own (:func:`node_key_problem`)."""


POLICY = "policy"
"""Validation-context key of the :class:`PlatformPolicy`."""


def udf_problem(function: str, allowed: Sequence[str] | None) -> str | None:
    """Why a UDF ``module:function`` may not run: never from the standard library or streamtopo itself
    (``os:system``, ``builtins:exec``), and on a platform that lists modules, only from those (or their
    submodules)."""
    module = function.split(":")[0]
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "streamtopo":
        return f"{function!r}: UDFs cannot come from the standard library or streamtopo ({top})"
    if allowed is not None and not any(module == m or module.startswith(m + ".") for m in allowed):
        listed = ", ".join(allowed) or "none"
        return f"{function!r}: module {module} is not among the platform's UDF modules ({listed})"
    return None


_OCI_REFERENCE = re.compile(
    r"^(?P<name>"
    r"(?:(?P<domain>(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?))*"
    r"(?::[0-9]+)?)/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$"
)
"""The distribution reference grammar (github.com/distribution/reference, the one container runtimes
parse): ``[domain[:port]/]path[:tag][@digest]``. A ``domain`` needs a dot or a port, or is localhost;
otherwise the first path component is part of the name (and lower case, as docker's normalisation
has it). Its quantifiers never overlap on the same characters, so matching is linear in the length."""
_PATH_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")


def image_reference_problem(image: str) -> str | None:
    """Why ``image`` is not an OCI image reference (the grammar above; names at most 255 characters)."""
    match = _OCI_REFERENCE.match(image)
    domain = match.group("domain") if match else None
    if domain and "." not in domain and ":" not in domain and domain != "localhost":
        match = None if not _PATH_COMPONENT.match(domain) else match  # not a registry: a path component
    if not match:
        return f"{image!r} is not an image reference ([registry[:port]/]name[:tag][@digest], lower-case name)"
    if len(match.group("name")) > 255:
        return f"{image!r}: the image name is longer than 255 characters"
    return None


def image_problem(image: str, default: str, allowed: Sequence[str] | None) -> str | None:
    """Why an executor image may not run: it must be an OCI image reference, and on a platform anything but
    its runtime image (the spec's default) must be under one of the platform's prefixes (a registry or
    repository path, compared at its ``/`` or ``:`` boundary); tenants' images run tenants' code next to
    the platform's credentials and nodes."""
    if problem := image_reference_problem(image):
        return problem
    if allowed is None or image == default or any(_under(image, prefix) for prefix in allowed):
        return None
    listed = ", ".join(allowed) or "none; the platform runs its runtime image only"
    return f"{image!r} is not among the platform's allowed images (prefixes: {listed})"


def _under(image: str, prefix: str) -> bool:
    """``registry.example.com/team/`` holds ``registry.example.com/team/app:1``; a prefix that ends inside a
    name component (``registry.example.com/te``) holds nothing: ``team-evil`` is not ``te``'s."""
    if not image.startswith(prefix):
        return False
    return prefix.endswith(("/", ":", "@")) or image[len(prefix) : len(prefix) + 1] in ("", "/", ":", "@")


def url_problem(url: str, allowed: Sequence[str] | None) -> str | None:
    """Why an HTTP(S) URL the operator would query may not be used: never with userinfo (credentials come
    from Secrets, and ``http://allowed@other/`` names ``other``); on a platform (``allowed`` given) only
    a URL whose parsed scheme, host and port equal one of ``allowed``'s and whose path is at or under
    that URL's path (``:90900`` or ``.evil.example`` are other hosts and ports, not longer prefixes)."""
    parsed = _http_url(url)
    if isinstance(parsed, str):
        return f"{url!r}: {parsed}"
    if allowed is None:
        return None
    for entry in allowed:
        other = _http_url(entry)
        if isinstance(other, str) or _origin(other) != _origin(parsed):
            continue
        base = other.path.rstrip("/")
        if parsed.path == base or parsed.path.startswith(base + "/") or not base:
            return None
    listed = ", ".join(allowed) or "none"
    return f"{url!r} is not among the platform's Prometheus URLs ({listed})"


def _http_url(url: str) -> SplitResult | str:
    """The parsed URL, or why it cannot be queried."""
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError as error:
        return f"not a URL ({error})"
    if parsed.scheme not in ("http", "https"):
        return "only http:// and https:// URLs"
    if "@" in parsed.netloc:
        return "a URL with userinfo (user:password@) is not allowed; use basicAuthSecret"
    if not parsed.hostname:
        return "the URL has no host"
    if any(segment in (".", "..") for segment in unquote(parsed.path).split("/")):
        return "no '.' or '..' path segments"
    if port == 0:
        return "port 0 is not a port"
    return parsed


def _origin(url: SplitResult) -> tuple[str, str, int]:
    default = 443 if url.scheme == "https" else 80
    return url.scheme, (url.hostname or "").lower().rstrip("."), url.port or default


LOADER_PREFIXES = (
    "STREAMTOPO_",
    "LD_",
    "DYLD_",
    "GLIBC_",
    "MALLOC_",
    "PYTHON",
    "PYSPARK_",
    "SPARK_",
    "PY4J_",
    "ARROW_",
    "JAVA_",
    "_JAVA_",
    "JDK_",
    "HADOOP_",
    "YARN_",
    "HIVE_",
    "KRB5",
    "PIP_",
    "CONDA_",
    "MPL",
    "OPENSSL_",
    "PERL",
    "RUBY",
    "NODE_",
    "BASH_",
    "LC_",
)
"""Environment variable families a tenant may not set on executors: the operator's own (STREAMTOPO_*), and
every family that makes a runtime in the image load code, libraries or configuration from a path or
option (the dynamic linker's LD_PRELOAD/LD_AUDIT/LD_LIBRARY_PATH, glibc's tunables and iconv modules,
Python's PYTHONPATH/PYTHONSTARTUP/PYTHONHOME, PySpark's PYSPARK_SUBMIT_ARGS, Spark's SPARK_CONF_DIR and
SPARK_SUBMIT_OPTS, Py4J's and Arrow's library paths, the JVM's JAVA_TOOL_OPTIONS/_JAVA_OPTIONS/
JDK_JAVA_OPTIONS, Hadoop's and Kerberos' configuration, pip, conda, matplotlib's MPLCONFIGDIR and
backends, OpenSSL's engine configuration, other interpreters' options, shells' startup files, locales)."""
LOADER_NAMES = frozenset(
    [
        "PATH",
        "HOME",
        "CLASSPATH",
        "TMPDIR",
        "ENV",
        "SHELL",
        "SHELLOPTS",
        "BASHOPTS",
        "IFS",
        "PS4",
        "CDPATH",
        "GCONV_PATH",
        "LOCPATH",
        "NLSPATH",
        "TZ",
        "TZDIR",
        "VIRTUAL_ENV",
        "HOSTALIASES",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "LOCALDOMAIN",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "IPYTHONDIR",
        "COVERAGE_PROCESS_START",
    ]
)
"""Single variables of the same kind: search paths (PATH, CLASSPATH), the home directory Python's user
site-packages and Spark's Ivy cache live under, the scratch directory, shell startup (ENV, BASH_ENV),
iconv and locale modules, the time zone (Spark SQL runs in UTC), name resolution overrides."""


def env_problem(name: str) -> str | None:
    """Why a tenant may not set executor environment variable ``name``."""
    if name.startswith("STREAMTOPO_"):
        return f"{name}: STREAMTOPO_* variables are the operator's"
    if name in LOADER_NAMES or name.startswith(LOADER_PREFIXES):
        return (
            f"{name}: variables that make the executor's runtimes (the dynamic linker, Python, PySpark, "
            "the JVM, Spark, Hadoop) load code or configuration are not allowed (docs/security.md)"
        )
    return None


SYSTEM_PATHS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
    "/app",
    "/src",
)
"""Directories of the executor image a tenant's volume may not be mounted at, over or under: the
runtime's code (Python's site-packages under /usr, the JVM under /usr/lib/jvm and /opt/java), the
dynamic linker's configuration (/etc/ld.so.preload), the operator's routing ConfigMap (/etc/streamtopo),
the scratch space and home (/tmp), and the kernel's file systems."""


def mount_problem(path: str) -> str | None:
    """Why a tenant volume may not be mounted at ``path`` (absolute): not ``/``, and not at, over or under
    a :data:`SYSTEM_PATHS` directory (mounting ``/usr`` or ``/usr/local/lib/python3.11/site-packages``
    would replace the runtime's code)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        return "no '..' in mount paths"
    normal = "/" + "/".join(parts)
    if normal == "/":
        return "/ is the executor's own root file system"
    top = "/" + parts[0]
    if top in SYSTEM_PATHS:
        return f"{path} is the executor's own ({top}; {', '.join(SYSTEM_PATHS)} hold the runtime)"
    return None


def shared_stream_problem(stream: str, policy: PlatformPolicy | None) -> str | None:
    """Why a source may not read ``stream``: on a platform, a stream of another namespace
    (``<namespace>/<name>``) must be one the platform shares. Locally there are no namespaces to guard."""
    if policy is None or "/" not in stream or stream in policy.shared_streams:
        return None
    shared = ", ".join(policy.shared_streams) or "none"
    return f"{stream!r} is another namespace's stream, which the platform does not share (shared: {shared})"


SCHEDULING_LABELS = (
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
)
"""The well-known node labels under kubernetes.io/ a tenant may select on; every other key there, and
under k8s.io/, is the cluster's (node roles, lifecycle taints such as not-ready or unschedulable)."""


def node_key_problem(key: str | None, policy: PlatformPolicy | None) -> str | None:
    """Why a tenant may not select on or tolerate node key ``key`` (None: a toleration of every taint).

    On a platform the cluster's own keys are refused (selecting control-plane nodes and tolerating their
    taint would put tenant code beside the cluster's secrets), and with ``policy.node_keys`` only the
    listed keys or prefixes pass. Locally (no policy) anything goes: there are no nodes to protect.
    """
    if policy is None:
        return None
    if key is None:
        return "a toleration without a key tolerates every taint, the cluster's own included"
    domain = key.split("/")[0] if "/" in key else ""
    if domain.endswith(("kubernetes.io", "k8s.io")) and key not in SCHEDULING_LABELS:
        return f"{key!r} belongs to the cluster (of its keys only {', '.join(SCHEDULING_LABELS)} may be used)"
    allowed = policy.node_keys
    if allowed and not any(key == a or (a.endswith("/") and key.startswith(a)) for a in allowed):
        return f"{key!r} is not among the platform's node keys ({', '.join(allowed)})"
    return None
