"""JSON Schemas of CDS Hooks 2.0 messages, transcribed from the specification's tables
(cds-hooks.org/specification/current: Discovery, Calling a CDS Service, CDS Service Response,
Card, Source, Link, Coding). REQUIRED fields are `required`; enumerated values are `enum`;
`summary` is "<140-character"; `extension` is the reserved extension object."""

from __future__ import annotations

from typing import Any

EXTENSION: dict[str, Any] = {"type": "object"}
CODING: dict[str, Any] = {
    "type": "object", "required": ["code"],
    "properties": {"code": {"type": "string"}, "system": {"type": "string"},
                   "display": {"type": "string"}},
}

DISCOVERY: dict[str, Any] = {
    "type": "object", "required": ["services"],
    "properties": {"services": {"type": "array", "items": {
        "type": "object", "required": ["hook", "description", "id"],
        "properties": {
            "hook": {"type": "string"}, "title": {"type": "string"},
            "description": {"type": "string"}, "id": {"type": "string"},
            "prefetch": {"type": "object", "additionalProperties": {"type": "string"}},
            "usageRequirements": {"type": "string"}, "extension": EXTENSION,
        },
        "additionalProperties": False}}},
}

REQUEST: dict[str, Any] = {
    "type": "object", "required": ["hook", "hookInstance", "context"],
    "properties": {
        "hook": {"type": "string"}, "hookInstance": {"type": "string"},
        "fhirServer": {"type": "string"},
        "fhirAuthorization": {"type": "object", "required": [
            "access_token", "token_type", "expires_in", "scope", "subject"]},
        "context": {"type": "object"},
        "prefetch": {"type": "object"},
        "extension": EXTENSION,
    },
    "additionalProperties": False,
    # the patient-view hook's context: userId and patientId REQUIRED, encounterId OPTIONAL
    "if": {"properties": {"hook": {"const": "patient-view"}}},
    "then": {"properties": {"context": {
        "required": ["userId", "patientId"],
        "properties": {"userId": {"type": "string",
                                  "pattern": "^(Practitioner|PractitionerRole|Patient|"
                                             "RelatedPerson)/.+"},
                       "patientId": {"type": "string"}, "encounterId": {"type": "string"}}}}},
}

CARD: dict[str, Any] = {
    "type": "object", "required": ["summary", "indicator", "source"],
    "properties": {
        "uuid": {"type": "string"},
        "summary": {"type": "string", "maxLength": 139},
        "detail": {"type": "string"},
        "indicator": {"enum": ["info", "warning", "critical"]},
        "source": {"type": "object", "required": ["label"], "properties": {
            "label": {"type": "string"}, "url": {"type": "string", "format": "uri"},
            "icon": {"type": "string"}, "topic": CODING}, "additionalProperties": False},
        "suggestions": {"type": "array"},
        "selectionBehavior": {"enum": ["at-most-one", "any"]},
        "overrideReasons": {"type": "array", "items": CODING},
        "links": {"type": "array", "items": {
            "type": "object", "required": ["label", "url", "type"],
            "properties": {"label": {"type": "string"}, "url": {"type": "string"},
                           "type": {"enum": ["absolute", "smart"]},
                           "appContext": {"type": "string"},
                           "autolaunchable": {"type": "boolean"}},
            "additionalProperties": False}},
        "extension": EXTENSION,
    },
    "additionalProperties": False,
    "dependentRequired": {"suggestions": ["selectionBehavior"]},
}

RESPONSE: dict[str, Any] = {
    "type": "object", "required": ["cards"],
    "properties": {"cards": {"type": "array", "items": CARD},
                   "systemActions": {"type": "array"}},
    "additionalProperties": False,
}
