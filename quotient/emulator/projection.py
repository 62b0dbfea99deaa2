"""The kubelet's projected ServiceAccount tokens: a pod's ``projected`` volumes with ``serviceAccountToken`` sources
get a token bound to the pod and its node, in a file its containers would read, renewed before it expires.

As the kubelet's token manager does (``pkg/kubelet/token``): each source's token is requested for the pod's
ServiceAccount, for the source's ``audience`` (the API server's when none) and ``expirationSeconds`` (default 3600, at
least 600), bound to the pod, whose node it then names; it is replaced once 80% of its life has passed, so a reader
that re-reads the file always finds one that holds. The token works while the pod exists (``authn``: a bound token
of a deleted pod is refused, as the API server refuses it), so a pod that is gone cannot lend its identity.

Files are laid out as the kubelet lays them out under ``/var/lib/kubelet``:
``<directory>/pods/<pod uid>/volumes/kubernetes.io~projected/<volume>/<path>``, in a temporary directory of the
emulator's own unless one is given, and written atomically (a new file renamed into place) so a reader never sees
half a token. The emulated nodes' agent processes are handed that path (``--nats-token-file``), as a DaemonSet's
container sees the volume. A ServiceAccount that does not exist leaves the volume empty and says so in the log (the
kubelet would hold the pod in ``ContainerCreating`` with ``FailedMount``).

``bound_pod`` also serves ``TokenRequest``'s ``boundObjectRef`` (``kubectl create token --bound-object-kind Pod``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from common import logs
from quotient.emulator import authn, status
from quotient.emulator.objects import Obj, metadata
from quotient.emulator.store import Store

log = logs.get("emulator.projection")

DEFAULT_EXPIRATION_S = 3600  # the projected volume's default expirationSeconds
RENEW_AT = 0.8  # the kubelet renews a token once 80% of its life has passed
_VOLUME_KIND = "kubernetes.io~projected"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TokenSource:
    """One ``serviceAccountToken`` source of a pod's projected volume."""

    volume: str
    path: str
    audience: str
    expiration_s: int


def token_sources(pod: Mapping[str, Any]) -> list[TokenSource]:
    """Every ``serviceAccountToken`` source of the pod's projected volumes (malformed ones are skipped, as the API
    server's validation would have refused them)."""
    found = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        projected = volume.get("projected") if isinstance(volume, dict) else None
        if not isinstance(projected, dict):
            continue
        for source in projected.get("sources") or []:
            token = source.get("serviceAccountToken") if isinstance(source, dict) else None
            if not isinstance(token, dict) or not isinstance(token.get("path"), str) or not volume.get("name"):
                continue
            expiration = token.get("expirationSeconds", DEFAULT_EXPIRATION_S)
            found.append(
                TokenSource(
                    volume=str(volume["name"]),
                    path=str(token["path"]),
                    audience=str(token.get("audience") or ""),
                    expiration_s=max(authn.MIN_EXPIRATION_S, int(expiration) if isinstance(expiration, int) else 0),
                )
            )
    return found


def bound_pod(store: Store, namespace: str, ref: Mapping[str, Any]) -> authn.PodBinding | status.Failure:
    """The pod a ``TokenRequest``'s ``boundObjectRef`` names (only pods are supported here), with its node."""
    kind, name, uid = ref.get("kind"), str(ref.get("name") or ""), str(ref.get("uid") or "")
    if kind != "Pod":
        return status.bad_request(f"boundObjectRef of kind {kind!r} is not supported by the emulator (only Pod)")
    pod = store.get("pods", namespace, name)
    if pod is None or (uid and metadata(pod).get("uid") != uid):
        return status.not_found("pods", name)
    return binding_of(store, pod)


def binding_of(store: Store, pod: Obj) -> authn.PodBinding:
    """The pod and the node it is bound to, as a token bound to it names them."""
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    node_obj = store.get("nodes", "", node) if node else None
    return authn.PodBinding(
        namespace=str(metadata(pod).get("namespace") or ""),
        name=str(metadata(pod).get("name") or ""),
        uid=str(metadata(pod).get("uid") or ""),
        node=node,
        node_uid=str(metadata(node_obj).get("uid") or "") if node_obj is not None else "",
    )


class Projections:
    """The projected tokens of the pods the kubelets run. Methods run on the emulator's loop."""

    def __init__(
        self, *, tokens: authn.Tokens, store: Store, clock: Callable[[], float], directory: Path | None = None
    ) -> None:
        self._tokens = tokens
        self._store = store
        self._clock = clock
        self._directory = directory
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._current: dict[tuple[str, str, str], str] = {}

    @property
    def directory(self) -> Path:
        if self._directory is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="quotient-kubelet-")
            self._directory = Path(self._tempdir.name)
        return self._directory

    def path(self, uid: str, volume: str, path: str) -> Path:
        """Where the pod ``uid`` finds ``path`` of its projected ``volume`` (it exists once the pod started)."""
        return self.directory / "pods" / uid / "volumes" / _VOLUME_KIND / volume / path

    def token(self, uid: str, volume: str, path: str) -> str | None:
        """The token now in ``path`` of the pod's ``volume``; None before the pod started or after it stopped."""
        return self._current.get((uid, volume, path))

    def start(self, pod: Obj, *, node: str) -> None:
        """Project the pod's tokens (a pod that started, or restarted) and renew them until ``stop``."""
        uid = str(metadata(pod).get("uid") or "")
        sources = token_sources(pod)
        if not sources or not uid:
            return
        self._cancel(uid)
        namespace = str(metadata(pod).get("namespace") or "")
        account_name = str((pod.get("spec") or {}).get("serviceAccountName") or "default")
        account = self._store.get("serviceaccounts", namespace, account_name)
        if account is None:
            log.warning(
                "projected_token_failed",
                pod=f"{namespace}/{metadata(pod).get('name')}",
                reason=f"serviceaccount {namespace}/{account_name} not found",
            )
            return
        binding = binding_of(self._store, pod)
        renew_in_s = None
        for source in sources:
            token, _ = self._tokens.issue_for_account(
                namespace,
                account_name,
                str(metadata(account).get("uid") or ""),
                expiration_s=source.expiration_s,
                audiences=[source.audience] if source.audience else [],
                pod=binding,
            )
            self._write(self.path(uid, source.volume, source.path), token)
            self._current[(uid, source.volume, source.path)] = token
            renew = source.expiration_s * RENEW_AT
            renew_in_s = renew if renew_in_s is None else min(renew_in_s, renew)
        log.debug("tokens_projected", pod=binding.name, node=node, volumes=len(sources))
        if renew_in_s is not None:
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to renew on
                self._timers[uid] = asyncio.get_running_loop().call_later(renew_in_s, self._renew, uid, node)

    def _renew(self, uid: str, node: str) -> None:
        self._timers.pop(uid, None)
        found = self._store.by_uid(uid)
        if found is None or found[0] != "pods":
            return
        try:
            self.start(found[1], node=node)
        except Exception:  # a failed renewal leaves the old token in place; the kubelet logs and retries too
            log.exception("projected_token_renewal_failed", pod_uid=uid)

    def stop(self, uid: str) -> None:
        """The pod stopped: no more renewals, and its volume's files go."""
        self._cancel(uid)
        for key in [key for key in self._current if key[0] == uid]:
            del self._current[key]
        if self._directory is not None:
            pod_dir = self._directory / "pods" / uid
            for file in sorted(pod_dir.rglob("*"), reverse=True):
                with contextlib.suppress(OSError):
                    file.unlink() if file.is_file() else file.rmdir()
            with contextlib.suppress(OSError):
                pod_dir.rmdir()

    def _cancel(self, uid: str) -> None:
        handle = self._timers.pop(uid, None)
        if handle is not None:
            handle.cancel()

    def close(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._current.clear()
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = None
            self._directory = None

    @staticmethod
    def _write(target: Path, token: str) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".token-")
        try:
            os.write(fd, token.encode("ascii"))
        finally:
            os.close(fd)
        Path(temporary).chmod(0o600)
        Path(temporary).replace(target)
