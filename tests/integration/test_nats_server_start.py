"""The embedded nats-server is ready only when it is ours that answers on its port.

``free_port`` closes the port it found before nats-server binds it, so another process may take it in between (the
suite starts hundreds of servers). A start that took another server's INFO for its own would hand clients a server
whose owner may stop it at any moment; the start must fail, saying the port is in use.
"""

from __future__ import annotations

import pytest

from common.errors import NatsServerError
from common.natsserver import NatsServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_a_start_on_a_port_another_server_holds_fails_and_says_the_address_is_in_use() -> None:
    with NatsServer(jetstream=False) as holder:
        second = NatsServer(port=holder.port, jetstream=False)
        with pytest.raises(NatsServerError, match=r"(?i)address already in use"):
            second.start()
        assert not second.running
        second.close()
        assert holder.running


def test_each_embedded_server_has_its_own_name_unless_given_one() -> None:
    assert NatsServer().server_name != NatsServer().server_name
    assert NatsServer(server_name="fixed").server_name == "fixed"
