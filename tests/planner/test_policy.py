"""What a platform lets tenants choose, read by grammar (planner/policy.py): URLs by parsed scheme, host
and port; images by the OCI reference grammar; environment variables and mounts that cannot load code."""

from __future__ import annotations

import pytest

from streamtopo.planner.policy import (
    env_problem,
    image_problem,
    image_reference_problem,
    mount_problem,
    url_problem,
)

ALLOWED = ("http://prometheus.monitoring:9090", "https://prom.team-a.example.com/prom")


@pytest.mark.parametrize(
    "url",
    [
        "http://prometheus.monitoring:9090",
        "http://prometheus.monitoring:9090/api/v1/query",
        "http://PROMETHEUS.monitoring:9090/",
        "https://prom.team-a.example.com/prom",
        "https://prom.team-a.example.com:443/prom/api/v1",
    ],
)
def test_urls_of_the_platform_pass(url):
    assert url_problem(url, ALLOWED) is None


@pytest.mark.parametrize(
    "url,words",
    [
        ("http://prometheus.monitoring:9090@evil.example/", "userinfo"),
        ("http://user:pw@prometheus.monitoring:9090", "userinfo"),
        ("http://prometheus.monitoring:90900", "not a URL"),
        ("http://prometheus.monitoring.evil.example:9090", "not among"),
        ("http://prometheus.monitoring:9091", "not among"),
        ("https://prometheus.monitoring:9090", "not among"),
        ("https://prom.team-a.example.com/prometheus", "not among"),
        ("https://prom.team-a.example.com/prom/../admin", "'..'"),
        ("https://prom.team-a.example.com/prom/%2e%2e/admin", "'..'"),
        ("ftp://prometheus.monitoring:9090", "only http"),
        ("http://:9090", "no host"),
    ],
)
def test_look_alike_urls_are_refused(url, words):
    problem = url_problem(url, ALLOWED)
    assert problem is not None and words in problem, problem


def test_userinfo_is_refused_without_a_platform_too():
    assert url_problem("http://me@localhost:9090", None) is not None
    assert url_problem("http://localhost:9090", None) is None


@pytest.mark.parametrize(
    "image",
    [
        "streamtopo/runtime:0.1.0",
        "registry.example.com:5000/team/app:1.2",
        "localhost/app",
        "ghcr.io/org/app@sha256:" + "a" * 64,
        "docker.io/library/nginx:1.25",
        "Registry.Example.com/app",
    ],
)
def test_oci_references_pass(image):
    assert image_reference_problem(image) is None


@pytest.mark.parametrize(
    "image",
    [
        "Bad Image!!:latest",
        "UPPER/app",
        "app:",
        "app:tag with space",
        "-bad",
        "ghcr.io/x@sha256:abc",
        "a//b",
        "",
    ],
)
def test_malformed_references_are_refused(image):
    assert image_reference_problem(image) is not None


def test_allowed_image_prefixes_end_at_a_component():
    allowed = ["registry.example.com/team"]
    default = "streamtopo/runtime:0.1.0"
    assert image_problem("registry.example.com/team/app:1", default, allowed) is None
    assert image_problem("registry.example.com/team:1", default, allowed) is None
    assert image_problem("registry.example.com/team-evil/app:1", default, allowed) is not None
    assert image_problem(default, default, allowed) is None


@pytest.mark.parametrize(
    "name",
    ["LD_PRELOAD", "LD_LIBRARY_PATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "PYTHONPATH"]
    + [
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "PYSPARK_SUBMIT_ARGS",
        "SPARK_CONF_DIR",
        "SPARK_SUBMIT_OPTS",
        "CLASSPATH",
    ]
    + ["HADOOP_CONF_DIR", "GCONV_PATH", "GLIBC_TUNABLES", "HOME", "PATH", "BASH_ENV", "MPLCONFIGDIR", "TZ"]
    + ["STREAMTOPO_TRANSPORT_PASSWORD"],
)
def test_loader_variables_are_refused(name):
    assert env_problem(name) is not None


@pytest.mark.parametrize("name", ["FEED_REGION", "API_TOKEN", "ld_preload", "MY_PYTHON_FLAG"])
def test_other_variables_pass(name):
    assert env_problem(name) is None


@pytest.mark.parametrize(
    "path",
    ["/", "/usr", "/usr/local/lib/python3.11/site-packages", "/etc", "/etc/streamtopo", "/opt/java"]
    + ["/tmp", "/tmp/x", "//usr//lib", "/./usr", "/lib64", "/proc/self", "/data/../usr"],
)
def test_mounts_over_the_runtime_are_refused(path):
    assert mount_problem(path) is not None


@pytest.mark.parametrize("path", ["/data", "/data/reference", "/models", "/srv/feeds", "/mnt/x"])
def test_other_mounts_pass(path):
    assert mount_problem(path) is None
