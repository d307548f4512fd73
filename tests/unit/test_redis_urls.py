"""SWITCHBOARD_REDIS_URL's forms: one-server URLs pass through, sentinel URLs are read,
everything else is a clear error naming the form expected (never the password)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from switchboard.shared.config import ConfigError, Settings
from switchboard.shared.store.urls import (
    ClusterUrl,
    SentinelUrl,
    parse_redis_url,
    plain_url_options,
)
from switchboard.workers.app import create_celery_app

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://:pw@redis.internal:6380/2",
        "rediss://user:pw@redis.example:6380/0",
        "unix:///run/redis.sock?db=1",
        "REDIS://host",
    ],
)
def test_one_server_urls_are_left_to_redis_py(url: str) -> None:
    assert parse_redis_url(url) is None


def test_sentinel_url_with_several_sentinels_master_and_db() -> None:
    parsed = parse_redis_url("redis+sentinel://10.0.0.1:26379,10.0.0.2:26380,s3/mymaster/3")
    assert parsed == SentinelUrl(
        sentinels=(("10.0.0.1", 26379), ("10.0.0.2", 26380), ("s3", 26379)),
        master="mymaster",
        db=3,
    )
    assert parsed.connection_kwargs() == {"db": 3}


def test_sentinel_url_db_defaults_to_0_and_trailing_slash_is_fine() -> None:
    for url in ("redis+sentinel://h:1/m", "redis+sentinel://h:1/m/"):
        parsed = parse_redis_url(url)
        assert parsed is not None and (parsed.master, parsed.db) == ("m", 0)


def test_sentinel_url_password_and_user_are_the_primarys() -> None:
    parsed = parse_redis_url("redis+sentinel://:p%40ss@h1:1,h2:2/m/0")
    assert parsed is not None
    assert parsed.connection_kwargs() == {"db": 0, "password": "p@ss"}
    named = parse_redis_url("redis+sentinel://app:pw@h1:1/m/1")
    assert named is not None
    assert named.connection_kwargs() == {"db": 1, "username": "app", "password": "pw"}
    bare = parse_redis_url("redis+sentinel://pw@h1:1/m")
    assert bare is not None and bare.connection_kwargs() == {"db": 0, "password": "pw"}


def test_sentinel_url_ipv6_sentinel() -> None:
    parsed = parse_redis_url("redis+sentinel://[::1]:26379,[fe80::2]/m")
    assert parsed is not None
    assert parsed.sentinels == (("::1", 26379), ("fe80::2", 26379))
    assert parsed.kombu_url() == "sentinel://[::1]:26379/0;sentinel://[fe80::2]:26379/0"


def test_kombu_form_lists_every_sentinel_with_db_and_quoted_password() -> None:
    parsed = parse_redis_url("redis+sentinel://:p%40ss@h1:1,h2:2/m/4")
    assert parsed is not None
    assert parsed.kombu_url() == "sentinel://:p%40ss@h1:1/4;sentinel://:p%40ss@h2:2/4"


def test_cluster_url_lists_its_seed_nodes_and_credentials() -> None:
    parsed = parse_redis_url("redis+cluster://:p%40ss@10.0.0.1:7000,10.0.0.2,[::1]:7002")
    assert parsed == ClusterUrl(
        nodes=(("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002)),
        username=None,
        password="p@ss",
    )
    assert parsed.connection_kwargs() == {"password": "p@ss"}
    named = parse_redis_url("redis+cluster://app:pw@h1:1")
    assert isinstance(named, ClusterUrl)
    assert named.connection_kwargs() == {"username": "app", "password": "pw"}


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis+cluster://h1:7000/1", "a cluster has database 0 only"),
        ("redis+cluster://h1:7000?x=1", "takes no ?query"),
        ("redis+cluster://h1:99999", "bad port '99999' for node h1"),
        ("redis+cluster://:7000", "a node address has no host"),
    ],
)
def test_bad_cluster_urls_are_one_clear_line(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_redis_url(url)
    message = str(raised.value)
    assert problem in message and "redis+cluster://[:password@]host:port" in message
    assert "\n" not in message and raised.value.key_path == "SWITCHBOARD_REDIS_URL"


def test_on_a_cluster_the_keys_are_cut_into_64_slot_groups() -> None:
    """A cluster spreads the state: 64 groups unless set, each with its own hash tag, so
    the prefix holds none; elsewhere one group."""
    cluster = Settings(redis_url="redis+cluster://h1:7000")
    assert (cluster.groups, cluster.key_prefix) == (64, "sb:")
    assert Settings(redis_url="redis://h1:6379").groups == 1
    assert Settings(redis_url="redis+cluster://h1:7000", slot_groups=16).groups == 16
    with pytest.raises(ValidationError, match=r"holds a \{hash tag\}"):
        Settings(redis_url="redis+cluster://h1:7000", key_prefix="x:{t}:")


def test_one_slot_group_on_a_cluster_makes_the_key_prefix_the_hash_tag() -> None:
    """With one group every key shares one slot: `sb:` becomes `{sb}:`; a prefix with a
    tag is kept."""
    one = "redis+cluster://h1:7000"
    assert Settings(redis_url=one, slot_groups=1).key_prefix == "{sb}:"
    assert Settings(redis_url=one, slot_groups=1, key_prefix="app:").key_prefix == "{app}:"
    assert Settings(redis_url=one, slot_groups=1, key_prefix="x:{t}:").key_prefix == "x:{t}:"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis+sentinel://h1:1", "no master name"),
        ("redis+sentinel://h1:1/", "no master name"),
        ("redis+sentinel:///m", "no host"),
        ("redis+sentinel://h1:1,,h2:2/m", "no host"),
        ("redis+sentinel://h1:port/m", "bad port 'port'"),
        ("redis+sentinel://h1:70000/m", "bad port '70000'"),
        ("redis+sentinel://h1:1/m/zero", "the database must be a number"),
        ("redis+sentinel://h1:1/m/0/x", "too many path segments"),
        ("redis+sentinel://h1:1/m?db=2", "unknown option 'db'"),
        ("redis+sentinel://[::1:1/m", "unclosed ["),
    ],
)
def test_bad_sentinel_urls_name_the_problem_and_the_form(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_redis_url(url)
    message = str(raised.value)
    assert problem in message
    assert message.startswith("SWITCHBOARD_REDIS_URL: ")
    assert message.endswith(
        "expected redis+sentinel://[:password@]host:port[,host:port...]/<master>[/db]"
        "[?sentinel_password=…] (over TLS: rediss+sentinel://…[?ssl_ca_certs=PATH&…])"
    )


@pytest.mark.parametrize("url", ["mongodb://h/0", "http://h:6379", "127.0.0.1:6379"])
def test_other_schemes_list_every_accepted_form(url: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_redis_url(url, "SWITCHBOARD_BROKER_URL")
    message = str(raised.value)
    assert message.startswith("SWITCHBOARD_BROKER_URL: ")
    for form in ("redis://", "rediss://", "unix://", "redis+sentinel://"):
        assert form in message


def test_errors_never_show_the_password() -> None:
    for url in ("redis+sentinel://:hunter2@h:bad/m", "redis+sentinel://:hunter2@h:1"):
        with pytest.raises(ConfigError) as raised:
            parse_redis_url(url)
        assert "hunter2" not in str(raised.value)


def test_celery_broker_follows_a_sentinel_redis_url() -> None:
    """With no broker URL set, the broker is the store's sentinel group, in kombu's form."""
    settings = Settings(redis_url="redis+sentinel://:pw@h1:1,h2:2/grp/5")
    app = create_celery_app(settings)
    assert app.conf.broker_url == "sentinel://:pw@h1:1/5;sentinel://:pw@h2:2/5"
    assert app.conf.broker_transport == "switchboard.workers.transport:SentinelTransport"
    assert app.conf.broker_transport_options["master_name"] == "grp"
    assert app.conf.broker_transport_options["visibility_timeout"] > 0


def test_celery_broker_keeps_its_own_url_and_the_plain_transport() -> None:
    settings = Settings(redis_url="redis+sentinel://h1:1/grp", broker_url="redis://b:6379/1")
    app = create_celery_app(settings)
    assert app.conf.broker_url == "redis://b:6379/1"
    assert app.conf.broker_transport == "switchboard.workers.transport:Transport"
    assert "master_name" not in app.conf.broker_transport_options


def test_celery_broker_refuses_a_cluster_url_naming_the_broker_setting() -> None:
    with pytest.raises(ConfigError, match=r"^a Redis Cluster cannot carry Celery's queues") as e:
        create_celery_app(Settings(redis_url="redis+cluster://h1:7000"))
    assert e.value.key_path == "SWITCHBOARD_BROKER_URL"
    with pytest.raises(ConfigError, match=r"kombu has no cluster transport"):
        create_celery_app(Settings(broker_url="redis+cluster://h1:7000"))
    with pytest.raises(ConfigError, match=r"kombu has no cluster transport"):
        create_celery_app(Settings(redis_url="rediss+cluster://h1:7000?ssl_cert_reqs=none"))


def test_state_on_a_cluster_with_its_own_broker_makes_a_celery_app() -> None:
    settings = Settings(redis_url="redis+cluster://h1:7000", broker_url="redis://b:6379/1")
    app = create_celery_app(settings)
    assert app.conf.broker_url == "redis://b:6379/1"


@pytest.mark.parametrize(
    ("url", "kombu"),
    [
        ("unix:///run/redis.sock", "redis+socket:///run/redis.sock"),
        ("unix:///run/redis.sock?db=4", "redis+socket:///run/redis.sock?virtual_host=4"),
        (
            "unix://:pw@/run/redis.sock?db=1&password=x",
            "redis+socket://:pw@/run/redis.sock?virtual_host=1&password=x",
        ),
    ],
)
def test_celery_broker_on_a_unix_socket_is_kombus_socket_form(url: str, kombu: str) -> None:
    """kombu reads no unix:// URL: the broker gets its redis+socket:// form, the database
    as its virtual host."""
    app = create_celery_app(Settings(redis_url=url))
    assert app.conf.broker_url == kombu
    assert app.conf.broker_transport == "switchboard.workers.transport:Transport"


def test_a_unix_socket_urls_connections_take_no_tcp_options() -> None:
    options = {"socket_keepalive": True, "socket_keepalive_options": {}, "socket_timeout": 3}
    assert plain_url_options("unix:///run/redis.sock", options) == {"socket_timeout": 3}
    assert plain_url_options("redis://h:1/0", options) == options


def test_a_tls_cluster_url_carries_its_ssl_options() -> None:
    parsed = parse_redis_url(
        "rediss+cluster://:pw@h1:7000,h2?ssl_ca_certs=/etc/ca.pem"
        "&ssl_cert_reqs=REQUIRED&ssl_check_hostname=false"
    )
    assert isinstance(parsed, ClusterUrl)
    assert parsed.tls and parsed.nodes == (("h1", 7000), ("h2", 6379))
    assert parsed.connection_kwargs() == {
        "ssl_ca_certs": "/etc/ca.pem",
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": False,
        "password": "pw",
    }
    assert parsed.client_kwargs() == {**parsed.connection_kwargs(), "ssl": True}
    plain = parse_redis_url("redis+cluster://h1:7000")
    assert isinstance(plain, ClusterUrl) and not plain.tls and plain.client_kwargs() == {}


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis+cluster://h1?ssl_ca_certs=/ca.pem", "takes no ?query"),
        ("rediss+cluster://h1?timeout=3", "unknown option 'timeout'"),
        ("rediss+cluster://h1?ssl_cert_reqs=maybe", "ssl_cert_reqs is one of"),
        ("rediss+cluster://h1?ssl_check_hostname=yes", "ssl_check_hostname is true or false"),
    ],
)
def test_a_tls_cluster_urls_bad_options_are_named(url: str, said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_redis_url(url)
    assert said in str(raised.value)
    assert "rediss+cluster://" in str(raised.value)


def test_a_tls_cluster_url_is_a_cluster_too() -> None:
    """rediss+cluster:// is cut into slot groups as redis+cluster:// is."""
    assert Settings(redis_url="rediss+cluster://h:1?ssl_cert_reqs=none").groups == 64


def test_a_tls_sentinel_url_reaches_sentinels_and_primary_over_tls() -> None:
    parsed = parse_redis_url(
        "rediss+sentinel://:pw@s1:26380,s2/mymaster/2?ssl_ca_certs=/etc/ca.pem"
        "&ssl_check_hostname=true"
    )
    assert isinstance(parsed, SentinelUrl)
    assert parsed.tls and parsed.sentinels == (("s1", 26380), ("s2", 26379))
    assert (parsed.master, parsed.db) == ("mymaster", 2)
    tls = {"ssl": True, "ssl_ca_certs": "/etc/ca.pem", "ssl_check_hostname": True}
    assert parsed.sentinel_kwargs() == tls
    assert parsed.connection_kwargs() == {"db": 2, **tls, "password": "pw"}
    assert parsed.kombu_ssl() == {"ssl_ca_certs": "/etc/ca.pem", "ssl_check_hostname": True}
    plain = parse_redis_url("redis+sentinel://s1/mymaster")
    assert isinstance(plain, SentinelUrl) and not plain.tls
    assert plain.sentinel_kwargs() == {} and plain.kombu_ssl() is None
    assert plain.connection_kwargs() == {"db": 0}
    # TLS with the system's certificate authorities: kombu still needs a non-empty dict.
    bare = parse_redis_url("rediss+sentinel://s1/mymaster")
    assert isinstance(bare, SentinelUrl) and bare.kombu_ssl() == {"ssl_cert_reqs": "required"}


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis+sentinel://s1/m?ssl_ca_certs=/ca.pem", "unknown option 'ssl_ca_certs'"),
        ("rediss+sentinel://s1/m?timeout=3", "unknown option 'timeout'"),
        ("rediss+sentinel://s1/m?ssl_cert_reqs=maybe", "ssl_cert_reqs is one of"),
        ("rediss+sentinel://s1?ssl_cert_reqs=none", "no master name"),
    ],
)
def test_a_tls_sentinel_urls_bad_options_are_named(url: str, said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_redis_url(url)
    assert said in str(raised.value)
    assert "rediss+sentinel://" in str(raised.value)


def test_celery_broker_on_a_tls_sentinel_group_asks_and_connects_over_tls() -> None:
    """The broker is kombu's sentinel form; the sentinels are asked over TLS (transport
    option ``sentinel_kwargs``) and the primary reached over TLS (``broker_use_ssl``)."""
    url = "rediss+sentinel://:pw@s1,s2:26380/mymaster/1?ssl_ca_certs=/etc/ca.pem"
    app = create_celery_app(Settings(redis_url=url))
    assert app.conf.broker_url == "sentinel://:pw@s1:26379/1;sentinel://:pw@s2:26380/1"
    assert app.conf.broker_transport == "switchboard.workers.transport:SentinelTransport"
    options = app.conf.broker_transport_options
    assert options["master_name"] == "mymaster"
    assert options["sentinel_kwargs"] == {"ssl": True, "ssl_ca_certs": "/etc/ca.pem"}
    assert app.conf.broker_use_ssl == {"ssl_ca_certs": "/etc/ca.pem"}
    plain = create_celery_app(Settings(redis_url="redis+sentinel://s1/mymaster"))
    assert "sentinel_kwargs" not in plain.conf.broker_transport_options
    assert not plain.conf.broker_use_ssl


def test_a_sentinel_url_gives_the_sentinels_their_own_password() -> None:
    parsed = parse_redis_url(
        "redis+sentinel://:datapw@s1/mymaster?sentinel_username=watch&sentinel_password=p%26w"
    )
    assert isinstance(parsed, SentinelUrl)
    assert parsed.sentinel_kwargs() == {"username": "watch", "password": "p&w"}
    assert parsed.connection_kwargs() == {"db": 0, "password": "datapw"}  # the data nodes'
    tls = parse_redis_url("rediss+sentinel://s1/m?sentinel_password=pw&ssl_cert_reqs=none")
    assert isinstance(tls, SentinelUrl)
    assert tls.sentinel_kwargs() == {"ssl": True, "ssl_cert_reqs": "none", "password": "pw"}
    assert tls.kombu_ssl() == {"ssl_cert_reqs": "none"}  # the password is the sentinels' only
    app = create_celery_app(Settings(redis_url="redis+sentinel://s1/m?sentinel_password=pw"))
    assert app.conf.broker_transport_options["sentinel_kwargs"] == {"password": "pw"}
    assert not app.conf.broker_use_ssl
    assert "pw" not in app.conf.broker_url
