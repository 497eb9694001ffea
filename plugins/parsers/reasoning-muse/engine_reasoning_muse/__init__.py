"""The muse reasoning parser plugin.

Manifest only; the implementation loads on selection.
"""

from engine.api import Option, Plugin

plugin = Plugin(
    name="muse",
    family="reasoning_parser",
    implementation="engine_reasoning_muse.impl",
    description="Muse Glimmer: to=self channels are reasoning, to=user content",
    options=(
        Option("--muse-keep-user-framing", type="bool", default=False,
               help="Keep the '<|start|>assistant to=user<|message|>...<|eot|>' framing of "
                    "user-facing messages in the content (default: unwrapped)."),
    ),
)
