"""A results store's row as kvinject writes one (kvinject/experiments/schemas.py), for tests that
write stores by hand: what a row must hold to be read back, to which a test adds its own."""

SETTINGS = {
    "bench": "nexttoken",
    "error": "none",
    "target": "kv",
    "layers": "all",
    "cache": {"type_k": "f16", "type_v": "f16", "flash_attn": "auto", "kv_rotation": True},
    "seed": 0,
    "options": {},
    "model_sha256": "0" * 64,
}
RECORD = {"label": "none", "metrics": {}, "items": {"accuracy": []}, "realized": {"k": {}, "v": {}}, "nonfinite_items": 0}
