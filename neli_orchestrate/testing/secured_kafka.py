"""A :class:`LocalKafka` with SASL/SCRAM authentication and the KRaft ``StandardAuthorizer``.

Usage::

    with SecuredLocalKafka() as kafka:
        alice = kafka.add_user("alice")            # librdkafka settings of principal User:alice
        kafka.grant(required_acls(config, "User:alice"))
        Producer({**alice, "transactional.id": "..."})

Clients reach the broker on one ``SASL_PLAINTEXT`` listener with ``SCRAM-SHA-512``, or
``SASL_SSL`` with ``tls=True``: the broker's certificate (for ``127.0.0.1`` and ``localhost``)
is signed by a CA generated per broker with ``openssl``; :attr:`ca_location` is its PEM file,
which every client's settings name as ``ssl.ca.location``. The super
user (``admin``, password random per broker) is created when the storage is formatted and is
what :meth:`client_settings` returns: the test harness, never a deployment. Every other
principal is an ordinary user: it may do exactly what its ACLs allow
(``allow.everyone.if.no.acl.found=false``).

.. note:: The controller listener stays ``PLAINTEXT`` on loopback, and its anonymous principal
   is a super user (the broker half of the node registers with the controller half through
   it). Only the client listener is secured; this is a test broker, not a hardening guide.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from typing import Any

from neli_orchestrate.acls import Acl
from neli_orchestrate.testing.local_kafka import LocalKafka, LocalKafkaError

__all__ = ["SecuredLocalKafka", "SCRAM_MECHANISM"]

log = logging.getLogger(__name__)

SCRAM_MECHANISM = "SCRAM-SHA-512"
_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


class SecuredLocalKafka(LocalKafka):
    """A :class:`LocalKafka` whose clients authenticate with SASL/SCRAM and obey ACLs.

    :param admin_user: the super user the harness connects as.
    :param admin_password: its password (random unless given).
    :param tls: serve ``SASL_SSL`` with a generated CA instead of ``SASL_PLAINTEXT``.

    :meth:`add_user` creates SCRAM principals, :meth:`grant` and :meth:`revoke` manage their
    ACLs; both return only once the broker enforces the change.
    """

    def __init__(self, *, admin_user: str = "admin", admin_password: str | None = None,
                 tls: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tls = tls
        self.protocol = "SASL_SSL" if tls else "SASL_PLAINTEXT"
        self.admin_user = admin_user
        self._admin_password = admin_password or secrets.token_urlsafe(16)
        self._admin_client: Any = None

    # -- clients -----------------------------------------------------------------------------

    def client_settings(self) -> dict[str, Any]:
        """librdkafka settings of the super user (the test harness only)."""
        return self.settings_for(self.admin_user, self._admin_password)

    def settings_for(self, user: str, password: str) -> dict[str, Any]:
        """librdkafka settings with which ``user`` authenticates to this broker."""
        settings = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.protocol,
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": password,
        }
        if self.tls:
            settings["ssl.ca.location"] = str(self.ca_location)
        return settings

    @property
    def ca_location(self) -> Any:
        """The PEM file of the CA that signed the broker's certificate (``tls=True``)."""
        return self.workdir / "tls" / "ca.pem"

    def admin(self) -> Any:
        """A super-user ``AdminClient`` (shared, created on first use)."""
        if self._admin_client is None:
            from confluent_kafka.admin import AdminClient

            conf: dict[str, Any] = {**self.client_settings(),
                                    "logger": logging.getLogger(__name__ + ".admin")}
            self._admin_client = AdminClient(conf)
        return self._admin_client

    def add_user(self, user: str, password: str | None = None,
                 timeout: float = 30.0) -> dict[str, Any]:
        """Create (or reset) SCRAM user ``user``; return the settings it connects with."""
        from confluent_kafka.admin import (
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        password = password or secrets.token_urlsafe(16)
        upsert = UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
            password.encode(), secrets.token_bytes(16))
        futures = self.admin().alter_user_scram_credentials([upsert], request_timeout=timeout)
        futures[user].result(timeout=timeout)
        settings = self.settings_for(user, password)
        self._wait_authenticates(settings, timeout)
        return settings

    def grant(self, acls: Iterable[Acl], timeout: float = 30.0) -> None:
        """Add ALLOW rules."""
        bindings = [acl.binding() for acl in acls]
        if not bindings:
            return
        for future in self.admin().create_acls(bindings, request_timeout=timeout).values():
            future.result(timeout=timeout)

    def revoke(self, acls: Iterable[Acl], timeout: float = 30.0) -> None:
        """Delete ALLOW rules (exact matches)."""
        from confluent_kafka.admin import AclBindingFilter

        filters = []
        for acl in acls:
            b = acl.binding()
            filters.append(AclBindingFilter(b.restype, b.name, b.resource_pattern_type,
                                            b.principal, b.host, b.operation,
                                            b.permission_type))
        if not filters:
            return
        for future in self.admin().delete_acls(filters, request_timeout=timeout).values():
            future.result(timeout=timeout)

    def _wait_authenticates(self, settings: dict[str, Any], timeout: float) -> None:
        # SCRAM credentials travel through the metadata log; the broker knows them a moment
        # after the controller accepted them.
        import time

        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            conf: dict[str, Any] = {**settings, "socket.timeout.ms": 2000,
                                    "logger": logging.getLogger(__name__ + ".probe")}
            probe = AdminClient(conf)
            try:
                probe.list_topics(timeout=2)
                return
            except Exception as exc:  # noqa: BLE001 - authentication not yet possible
                last = exc
            time.sleep(0.1)
        raise LocalKafkaError(f"user {settings['sasl.username']!r} cannot authenticate: {last}")

    def stop(self, timeout: float = 20.0) -> None:
        self._admin_client = None
        super().stop(timeout)

    # -- LocalKafka hooks --------------------------------------------------------------------

    def _security_properties(self) -> dict[str, str]:
        assert self.port is not None and self.controller_port is not None
        listener = self.protocol
        jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required '
                f'username="{self.admin_user}" password="{self._admin_password}";')
        return {
            "listeners": f"{listener}://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"{listener}://127.0.0.1:{self.port}",
            "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{listener}:{listener}",
            "inter.broker.listener.name": listener,
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            f"listener.name.{listener.lower()}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": jaas,
            "authorizer.class.name": _AUTHORIZER,
            "super.users": f"User:{self.admin_user};User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
            **(self._tls_properties() if self.tls else {}),
        }

    def _tls_properties(self) -> dict[str, str]:
        """Generate a CA and a broker certificate (once per broker); PEM stores for Kafka."""
        tls = self.workdir / "tls"
        key_password = self._admin_password  # protects the broker's key file only
        if not (tls / "broker.pem").exists():
            tls.mkdir(parents=True, exist_ok=True)
            openssl = shutil.which("openssl")
            if openssl is None:
                raise LocalKafkaError("tls=True needs the `openssl` command to generate a CA")
            (tls / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
            steps = [
                ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                 "-out", "ca.pem", "-days", "2", "-subj", "/CN=neli-test-ca"],
                ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key",
                 "-out", "broker.csr", "-subj", "/CN=localhost"],
                ["x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", "broker.crt", "-days", "2",
                 "-extfile", "san.ext"],
                # Java's PEM reader (Kafka's PEM keystore) cannot decrypt PBES2 keys
                ["pkcs8", "-topk8", "-v1", "PBE-SHA1-3DES", "-in", "broker.key",
                 "-out", "broker.enc.key", "-passout", "env:NELI_TLS_KEY_PASSWORD"],
            ]
            for step in steps:
                proc = subprocess.run([openssl, *step], cwd=tls, capture_output=True, text=True,
                                      env={"NELI_TLS_KEY_PASSWORD": key_password}, timeout=60)
                if proc.returncode != 0:
                    raise LocalKafkaError(f"openssl {step[0]} failed: {proc.stderr[-2000:]}")
            (tls / "broker.pem").write_text((tls / "broker.enc.key").read_text()
                                            + (tls / "broker.crt").read_text())
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(tls / "broker.pem"),
            "ssl.key.password": key_password,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(tls / "ca.pem"),
        }

    def _format_args(self) -> list[str]:
        return ["--add-scram",
                f"{SCRAM_MECHANISM}=[name={self.admin_user},password={self._admin_password}]"]
