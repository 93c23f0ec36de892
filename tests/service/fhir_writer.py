"""FHIR R4 Bundles written as a hospital would, independently of `scehr.service.interop`.

The LOINC codes and UCUM units here are this file's own table (written from LOINC, not read
from the catalog), so a test that feeds these Bundles to the service checks the catalog's
mapping rather than reusing it. `python -m tests.service.fhir_writer` rewrites the examples
(`examples/fhir_bundle.json`, `examples/cds_hooks_request.json`) from
`examples/mortality_stay.json`; a test checks they are current.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from scehr.schemas.variables import CATALOG

REPO = Path(__file__).resolve().parents[2]
LOINC = "http://loinc.org"
UCUM = "http://unitsofmeasure.org"
BP_PANEL = "85354-9"
SNOMED = "http://snomed.info/sct"
VENTILATION = "40617009"  # SNOMED CT |Artificial respiration (procedure)|
HSLOC = "https://www.cdc.gov/nhsn/cdaportal/terminology/codesystem/hsloc.html"
#: PhysioNet ICU type -> CDC NHSN location code (coronary, cardiac surgery, medical, surgical)
ICU_HSLOC = {"1": "1028-0", "2": "1032-2", "3": "1027-2", "4": "1030-6"}

#: variable id -> (LOINC code, UCUM unit or None for scores/categories)
CODES: dict[str, tuple[str, str | None]] = {
    "heart_rate": ("8867-4", "/min"),
    "respiratory_rate": ("9279-1", "/min"),
    "o2_saturation": ("59408-5", "%"),
    "systolic_bp": ("8480-6", "mm[Hg]"),
    "diastolic_bp": ("8462-4", "mm[Hg]"),
    "mean_bp": ("8478-0", "mm[Hg]"),
    "temperature": ("8310-5", "Cel"),
    "glucose": ("2345-7", "mg/dL"),
    "fio2": ("3150-0", "%"),
    "ph": ("11558-4", "[pH]"),
    "height": ("8302-2", "cm"),
    "weight": ("29463-7", "kg"),
    "gcs_eye": ("9267-6", None),
    "gcs_motor": ("9268-4", None),
    "gcs_verbal": ("9270-0", None),
    "gcs_total": ("9269-2", None),
    # the full PhysioNet 2012 set: a cuff pressure sent with the generic vital-signs codes, as
    # FHIR's vital-signs profile does; labs and blood gases with their serum/arterial codes
    "noninvasive_systolic_bp": ("8480-6", "mm[Hg]"),
    "noninvasive_diastolic_bp": ("8462-4", "mm[Hg]"),
    "noninvasive_mean_bp": ("8478-0", "mm[Hg]"),
    "lactate": ("2524-7", "mmol/L"),
    "creatinine": ("2160-0", "mg/dL"),
    "bun": ("3094-0", "mg/dL"),
    "sodium": ("2951-2", "mmol/L"),
    "potassium": ("2823-3", "mmol/L"),
    "hco3": ("1963-8", "mmol/L"),
    "wbc": ("6690-2", "10*3/uL"),
    "platelets": ("777-3", "10*3/uL"),
    "hematocrit": ("4544-3", "%"),
    "magnesium": ("19123-9", "mg/dL"),
    "pao2": ("2703-7", "mm[Hg]"),
    "paco2": ("2019-8", "mm[Hg]"),
    "sao2": ("2708-6", "%"),
    "urine_output": ("9187-6", "mL"),
    "invasive_systolic_bp": ("76215-3", "mm[Hg]"),
    "invasive_diastolic_bp": ("76213-8", "mm[Hg]"),
    "invasive_mean_bp": ("76214-6", "mm[Hg]"),
    "albumin": ("1751-7", "g/dL"),
    "bilirubin": ("1975-2", "mg/dL"),
    "alp": ("6768-6", "U/L"),
    "alt": ("1742-6", "U/L"),
    "ast": ("1920-8", "U/L"),
    "cholesterol": ("2093-3", "mg/dL"),
    "troponin_i": ("10839-9", "ng/mL"),
    "troponin_t": ("6598-7", "ng/mL"),
}
SYSTOLIC = ("systolic_bp", "noninvasive_systolic_bp")
DIASTOLIC = ("diastolic_bp", "noninvasive_diastolic_bp")


@dataclass
class Item:
    """One measurement: hours after admission, LOINC code, value, UCUM unit."""

    hours: float
    code: str
    value: float | str
    unit: str | None = None


def _quantity(value: float | str, unit: str | None) -> dict[str, Any]:
    if isinstance(value, str):
        return {"valueString": value}
    q: dict[str, Any] = {"value": value}
    if unit:
        q.update(unit=unit, system=UCUM, code=unit)
    else:
        q.update(unit="{score}", system=UCUM, code="{score}")
    return {"valueQuantity": q}


def _coding(code: str) -> dict[str, Any]:
    return {"coding": [{"system": LOINC, "code": code}]}


def _time(admission: datetime, hours: float) -> str:
    return (admission + timedelta(hours=hours)).isoformat().replace("+00:00", "Z")


def observation(oid: str, patient: str, admission: datetime, group: list[Item]
                ) -> dict[str, Any]:
    """One Observation; a systolic + diastolic pair becomes a blood-pressure panel."""
    base: dict[str, Any] = {
        "resourceType": "Observation", "id": oid, "status": "final",
        "category": [{"coding": [{
            "system": "http://terminology.hl7.org/CodeSystem/observation-category",
            "code": "vital-signs"}]}],
        "subject": {"reference": f"Patient/{patient}"},
        "effectiveDateTime": _time(admission, group[0].hours),
    }
    if len(group) == 1:
        it = group[0]
        return {**base, "code": _coding(it.code), **_quantity(it.value, it.unit)}
    return {**base, "code": _coding(BP_PANEL),
            "component": [{"code": _coding(it.code), **_quantity(it.value, it.unit)}
                          for it in group]}


def unit_and_ventilation(stay: dict[str, Any], patient: str, admission: datetime
                         ) -> list[dict[str, Any]]:
    """The ICU unit as a Location typed with its HSLOC code, and one mechanical-ventilation
    Procedure (SNOMED CT) per charted ventilation, from a long-form JSON stay."""
    out: list[dict[str, Any]] = []
    for o in stay["observations"]:
        if o["variable"] == "icu_type" and str(o["value"]) in ICU_HSLOC:
            out.append({"resourceType": "Location", "id": f"{patient}-unit", "type": [
                {"coding": [{"system": HSLOC, "code": ICU_HSLOC[str(o["value"])]}]}]})
        elif o["variable"] == "mechanical_ventilation" and float(o["value"]) == 1.0:
            out.append({"resourceType": "Procedure", "id": f"{patient}-vent-{len(out)}",
                        "status": "completed",
                        "code": {"coding": [{"system": SNOMED, "code": VENTILATION}]},
                        "subject": {"reference": f"Patient/{patient}"},
                        "performedDateTime": _time(admission, float(o["time"]))})
    return out


def bundle(groups: list[list[Item]], *, admission: datetime, patient: str = "example",
           birth_date: date | None = None, gender: str | None = None,
           with_encounter: bool = True, kind: str = "collection",
           extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Bundle with the Patient, the ICU Encounter, one Observation per group, and `extra`
    resources (a Location among them is the Encounter's)."""
    pat: dict[str, Any] = {"resourceType": "Patient", "id": patient}
    if birth_date is not None:
        pat["birthDate"] = birth_date.isoformat()
    if gender is not None:
        pat["gender"] = gender
    entries = [pat]
    if with_encounter:
        entries.append({
            "resourceType": "Encounter", "id": f"{patient}-icu", "status": "in-progress",
            "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                      "code": "IMP", "display": "inpatient encounter"},
            "subject": {"reference": f"Patient/{patient}"},
            "period": {"start": _time(admission, 0.0)}})
        units = [r for r in extra or [] if r["resourceType"] == "Location"]
        if units:
            entries[-1]["location"] = [{"location": {"reference": f"Location/{units[0]['id']}"}}]
    entries += [observation(f"{patient}-obs-{i}", patient, admission, g)
                for i, g in enumerate(groups)]
    entries += extra or []
    return {"resourceType": "Bundle", "type": kind,
            "entry": [{"fullUrl": f"urn:example:{e['resourceType']}/{e['id']}",
                       "resource": e} for e in entries]}


def birth_date_for(age_years: int, admission: datetime) -> date:
    """A birth date giving exactly `age_years` completed years at admission."""
    d = admission.date()
    return d.replace(year=d.year - age_years)


def groups_from_stay(stay: dict[str, Any]) -> list[list[Item]]:
    """A long-form JSON stay as FHIR groups (systolic + diastolic at one time -> a panel).

    Variables without a LOINC code here (capillary refill, ICU type, mechanical ventilation)
    are left out: `unit_and_ventilation` writes the last two as a Location and Procedures.
    """
    groups: list[list[Item]] = []
    pending_sys: dict[float, list[Item]] = {}
    for o in stay["observations"]:
        if o["variable"] not in CODES:
            continue
        code, unit = CODES[o["variable"]]
        value = o["value"]
        if unit is None and isinstance(value, str) and value.replace(".", "").isdigit():
            value = float(value)  # a score sent as text: FHIR carries it as a quantity
        item = Item(float(o["time"]), code, value, o.get("unit") or unit)
        if o["variable"] in SYSTOLIC:
            group = [item]
            pending_sys[item.hours] = group
            groups.append(group)
        elif o["variable"] in DIASTOLIC and item.hours in pending_sys:
            pending_sys.pop(item.hours).append(item)
        else:
            groups.append([item])
    return groups


EXAMPLE_ADMISSION = datetime.fromisoformat("2026-01-15T08:00:00+00:00")


def example_bundle() -> dict[str, Any]:
    stay = json.loads((REPO / "examples" / "mortality_stay.json").read_text())
    demo = stay["demographics"]
    return bundle(groups_from_stay(stay), admission=EXAMPLE_ADMISSION, patient="example",
                  birth_date=birth_date_for(int(demo["age"]), EXAMPLE_ADMISSION),
                  gender=demo["sex"],
                  extra=unit_and_ventilation(stay, "example", EXAMPLE_ADMISSION))


#: What a Bundle carries besides the LOINC-coded variables (`unit_and_ventilation`).
NOT_LOINC = ("icu_type", "mechanical_ventilation")


def long_from_wide(wide: dict[str, Any]) -> dict[str, Any]:
    """A wide-form JSON stay (e.g. a converted benchmark CSV) as the long-form stay of what a
    Bundle can carry: the variables with a LOINC code here, each observation with the unit of
    its column, the ICU type as its code, and ventilation only where charted (a Bundle has a
    Procedure for it, nothing for "not ventilated")."""
    by_name = {v.benchmark_name: v.id for v in CATALOG}
    w = wide["wide"]
    obs: list[dict[str, Any]] = []
    for column, values in w["columns"].items():
        var = by_name[column]
        if var not in CODES and var not in NOT_LOINC:
            continue
        unit = w["units"].get(column)
        for h, x in zip(w["hours"], values, strict=True):
            if x is None or (var == "mechanical_ventilation" and float(x) != 1.0):
                continue
            obs.append({"variable": var, "time": h,
                        "value": str(int(float(x))) if var == "icu_type" else x,
                        **({"unit": unit} if unit else {})})
    obs.sort(key=lambda o: o["time"])
    return {"id": wide.get("id", "stay"), "observations": obs,
            **({"demographics": wide["demographics"]} if "demographics" in wide else {})}


def bundle_of_stay(stay: dict[str, Any], patient: str = "p") -> dict[str, Any]:
    """A long-form JSON stay as the Bundle a hospital would send of it (`bundle`), admitted
    at `EXAMPLE_ADMISSION`, with its age as a birth date and its sex as the gender."""
    demo = stay.get("demographics", {})
    return bundle(groups_from_stay(stay), admission=EXAMPLE_ADMISSION, patient=patient,
                  birth_date=birth_date_for(int(demo["age"]), EXAMPLE_ADMISSION)
                  if "age" in demo else None, gender=demo.get("sex"),
                  extra=unit_and_ventilation(stay, patient, EXAMPLE_ADMISSION))


def searchset(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A complete searchset Bundle of Bundle entries (their fullUrls kept)."""
    return {"resourceType": "Bundle", "type": "searchset", "total": len(entries),
            "entry": entries}


def cds_request(b: dict[str, Any], *, user: str = "Practitioner/example",
                hook_instance: str = "d1577c69-dfbe-44ad-ba6d-3e05e953b2ea") -> dict[str, Any]:
    """A patient-view call prefetching what the Bundle `b` holds, keyed as the discovery's
    templates: its first Patient and Encounter (named by the context), its Observations and
    Procedures as searchsets, its Location (a searchset when there are several)."""
    def of(kind: str) -> list[dict[str, Any]]:
        return [e for e in b["entry"] if e["resource"]["resourceType"] == kind]

    patient, encounter = of("Patient")[0]["resource"], of("Encounter")[0]["resource"]
    units = of("Location")
    return {
        "hook": "patient-view",
        "hookInstance": hook_instance,
        "context": {"userId": user, "patientId": patient.get("id"),
                    "encounterId": encounter.get("id")},
        "prefetch": {
            "patient": patient,
            "encounter": encounter,
            "observations": searchset(of("Observation")),
            **({"location": units[0]["resource"] if len(units) == 1 else searchset(units)}
               if units else {}),
            "procedures": searchset(of("Procedure")),
        },
    }


def example_cds_request() -> dict[str, Any]:
    return cds_request(example_bundle())


def _compact(doc: Any, indent: str) -> str:
    """JSON with one Bundle entry (or one top-level field) per line: readable, not huge."""
    if isinstance(doc, dict) and isinstance(doc.get("entry"), list):
        head = json.dumps({k: v for k, v in doc.items() if k != "entry"})[:-1]
        rows = f",\n{indent}  ".join(json.dumps(e) for e in doc["entry"])
        return f'{head}, "entry": [\n{indent}  {rows}\n{indent}]}}'
    if isinstance(doc, dict) and indent == "":
        rows = ",\n  ".join(f"{json.dumps(k)}: {_compact(v, '  ')}" for k, v in doc.items())
        return "{\n  " + rows + "\n}"
    if isinstance(doc, dict) and "observations" in doc:
        rows = f",\n{indent}  ".join(f"{json.dumps(k)}: {_compact(v, indent + '  ')}"
                                     for k, v in doc.items())
        return f"{{\n{indent}  {rows}\n{indent}}}"
    return json.dumps(doc)


def render(doc: dict[str, Any]) -> str:
    return _compact(doc, "") + "\n"


EXAMPLES = {"fhir_bundle.json": example_bundle, "cds_hooks_request.json": example_cds_request}

if __name__ == "__main__":
    for name, make in EXAMPLES.items():
        (REPO / "examples" / name).write_text(render(make()))
