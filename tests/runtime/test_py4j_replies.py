"""The JVM end of each thread's py4j connection sends its replies without Nagle's delay."""

from __future__ import annotations

import threading

from streamtopo.runtime.spark import serving_connection, without_reply_delay


def _no_delay(spark) -> bool:
    jvm = spark._jvm
    return bool(serving_connection(jvm, jvm.java.lang.Thread.currentThread()).getSocket().getTcpNoDelay())


def test_each_threads_connection_replies_without_delay_and_long_replies_arrive_whole(spark):
    seen: dict[str, object] = {}

    def in_a_new_thread() -> None:
        seen["before"] = _no_delay(spark)  # a new thread's new connection: py4j's default
        without_reply_delay(spark)
        without_reply_delay(spark)  # once per connection: the second finds it done
        seen["after"] = _no_delay(spark)
        seen["reply"] = spark._jvm.org.apache.commons.lang3.StringUtils.repeat("ab", 20_000)

    thread = threading.Thread(target=in_a_new_thread)
    thread.start()
    thread.join()
    assert seen == {"before": False, "after": True, "reply": "ab" * 20_000}
