"""Course credentials: Open Badges 3.0, signed with eddsa-rdfc-2022, verifiable offline.

- ``keys``: Ed25519 key files, fingerprints, ``did:key`` / ``did:web``, base58btc and multibase
- ``proof``: Data Integrity proofs (eddsa-rdfc-2022, RDFC-1.0 through pyld) on the shipped contexts
- ``status``: revocation with a Bitstring Status List
- ``badge``: the ``OpenBadgeCredential`` of the course: ``Achievement``, ``issue``, ``verify``
- ``contexts/``: the JSON-LD contexts (sources in ``contexts/SOURCES.md``); nothing is fetched

The library's API, re-exported here (the course service and the command line use only these)::

    from parallel_lab.course import credentials as cr
    cr.keygen(DIR)                                # NAME.key (0600) + NAME.pub
    key = cr.load_private_key(PATH); pub = cr.load_public_key(PATH)   # or cr.parse_public_key(text)
    cr.did_key(pub); cr.fingerprint(pub)
    entry = cr.status_entry("https://host/status/1", index)           # to make a credential revocable
    c = cr.issue("Ada Lovelace", "ada@example.org", cr.Achievement({"01": ["ring-all-reduce"]}), key,
                 "parallel-lab course service", credential_id="https://host/credentials/ID", status=entry)
    lst = cr.status_list_credential("https://host/status/1", revoked_indices, key)
    r = cr.verify(c, pub, status_list=lst)        # r.valid, r.reason, r.code, r.fingerprint, r.revoked, ...
    cr.is_revoked(lst, index)

Verifying never raises on a bad credential; issuing raises ValueError on bad input.
"""

from parallel_lab.course.credentials.badge import (  # noqa: F401
    CODES,
    COURSE,
    Achievement,
    Verification,
    identity_hash,
    issue,
    subject_matches,
    verify,
)
from parallel_lab.course.credentials.keys import (  # noqa: F401
    did_key,
    did_web,
    did_web_document,
    fingerprint,
    keygen,
    load_private_key,
    load_public_key,
    parse_public_key,
)
from parallel_lab.course.credentials.status import (  # noqa: F401
    is_revoked,
    revoked_indices,
    status_entry,
    status_list_credential,
)
