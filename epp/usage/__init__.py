"""Token usage in answers, for both front ends (ext_proc and the gateway) and for parsers with answers of their own.

:mod:`~epp.usage.shapes` reads the ``(prompt, completion, cached)`` triple out of a decoded answer or event,
:mod:`~epp.usage.reader` out of a body as it streams past (:class:`UsageReader`), and :mod:`~epp.usage.restorer`
gives the client back, in the answer, what EPP changed on the way up (:class:`ResponseRestorer`: the model name
after a rewrite, the prefiller's cached-token count after a P/D prefill). Nothing here imports the rest of EPP.
"""

from __future__ import annotations

from epp.usage.reader import MessagesUsageReader, UsageReader, messages_usage_from_body, usage_from_body
from epp.usage.restorer import ResponseRestorer, restore_body
from epp.usage.shapes import NO_USAGE, Usage, UsageReading, messages_stream_usage, messages_usage, usage_dict, usage_of

__all__ = ["Usage", "NO_USAGE", "UsageReading", "usage_of", "usage_dict", "messages_usage", "messages_stream_usage",
           "UsageReader", "MessagesUsageReader", "usage_from_body", "messages_usage_from_body", "ResponseRestorer",
           "restore_body"]
