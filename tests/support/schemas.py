"""JSON schemas the structured-output tests share."""

# A person: required and optional properties, bounds, a format, an array and a nested object. Its shortest
# valid answer is 12 tokens of the tiny vocabulary.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    "required": ["name", "age"],
}
