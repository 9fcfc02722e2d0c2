"""``/v1/documents`` on the corpus, per tenant."""

from __future__ import annotations

import httpx
import pytest

ALICE = {"authorization": "Bearer alice-key"}
BOB = {"authorization": "Bearer bob-key"}


def test_create_get_list_delete(gateway_url: str) -> None:
    with httpx.Client(base_url=gateway_url, headers=ALICE) as c:
        r = c.post(
            "/v1/documents", json={"id": "pkg/mod.py", "text": "x = 1\n", "language": "python"}
        )
        assert r.status_code == 201
        created = r.json()
        assert (
            created["id"] == "pkg/mod.py" and created["bytes"] == 6 and len(created["sha256"]) == 64
        )
        doc = c.get("/v1/documents/pkg/mod.py").json()
        assert doc["text"] == "x = 1\n" and doc["language"] == "python"
        ids = [d["id"] for d in c.get("/v1/documents").json()["data"]]
        assert "pkg/mod.py" in ids
        assert c.delete("/v1/documents/pkg/mod.py").json()["deleted"] is True
        assert c.get("/v1/documents/pkg/mod.py").status_code == 404
        assert c.delete("/v1/documents/pkg/mod.py").status_code == 404
        # without a language the gateway names it from the extension (sdk.languages)
        assert (
            c.post("/v1/documents", json={"id": "a/b.rs", "text": "fn main() {}\n"}).status_code
            == 201
        )
        assert c.get("/v1/documents/a/b.rs").json()["language"] == "rust"


def test_another_tenants_document_is_404(gateway_url: str) -> None:
    httpx.post(
        f"{gateway_url}/v1/documents",
        json={"id": "secret.txt", "text": "alice only"},
        headers=ALICE,
    ).raise_for_status()
    with httpx.Client(base_url=gateway_url, headers=BOB) as c:
        assert c.get("/v1/documents/secret.txt").status_code == 404
        assert c.delete("/v1/documents/secret.txt").status_code == 404
        assert "secret.txt" not in [d["id"] for d in c.get("/v1/documents").json()["data"]]
    r = httpx.get(f"{gateway_url}/v1/documents/secret.txt", headers=ALICE)
    assert r.json()["text"] == "alice only"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"text": "no id"}, 400, "id"),
        ({"id": "a"}, 400, "text"),
        ({"id": "a", "text": "x", "colour": "red"}, 400, "colour"),
        ({"id": "big", "text": "x" * (2 << 20)}, 413, "text"),
    ],
)
def test_bad_documents(gateway_url: str, body: dict[str, str], status: int, param: str) -> None:
    r = httpx.post(f"{gateway_url}/v1/documents", json=body, headers=ALICE)
    assert r.status_code == status
    assert r.json()["error"]["param"] == param


def test_documents_need_a_key(gateway_url: str) -> None:
    assert httpx.get(f"{gateway_url}/v1/documents").status_code == 401
    r = httpx.post(
        f"{gateway_url}/v1/documents",
        content=b"{",
        headers={**ALICE, "content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
