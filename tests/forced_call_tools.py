"""The tools the forced-tool-call tests offer (bounded strings and an enum, so every forced call
stays short), shared by the runtime and the server tests."""

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                     "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string", "maxLength": 10}},
        "required": ["tz"], "additionalProperties": False}}}]
