"""Codings of the predicted outcomes, for interoperable outputs (FHIR RiskAssessment).

The code systems and codes live here; each task in schemas/tasks.py names its labels' codings
(`scehr.schemas.tasks.outcome_coding` looks a label up across the tasks).

Mortality is the SNOMED CT finding "Dead"; the 25 benchmark phenotypes are HCUP CCS 2015
single-level diagnosis groups (their ICD-9-CM members are in mimic3-benchmarks'
`hcup_ccs_2015_definitions.yaml`; a test checks these ids against it when the data is present).
"""

from __future__ import annotations

from dataclasses import dataclass

SNOMED = "http://snomed.info/sct"
CCS = "http://www.hcup-us.ahrq.gov/toolssoftware/ccs/ccs.jsp"


@dataclass(frozen=True)
class Coding:
    system: str
    code: str
    display: str


MORTALITY = Coding(SNOMED, "419099009", "Dead (in-hospital death)")

#: Benchmark phenotype label -> its CCS single-level group id.
PHENOTYPE_CCS: dict[str, int] = {
    "Septicemia (except in labor)": 2,
    "Diabetes mellitus without complication": 49,
    "Diabetes mellitus with complications": 50,
    "Disorders of lipid metabolism": 53,
    "Fluid and electrolyte disorders": 55,
    "Essential hypertension": 98,
    "Hypertension with complications and secondary hypertension": 99,
    "Acute myocardial infarction": 100,
    "Coronary atherosclerosis and other heart disease": 101,
    "Conduction disorders": 105,
    "Cardiac dysrhythmias": 106,
    "Congestive heart failure; nonhypertensive": 108,
    "Acute cerebrovascular disease": 109,
    "Pneumonia (except that caused by tuberculosis or sexually transmitted disease)": 122,
    "Chronic obstructive pulmonary disease and bronchiectasis": 127,
    "Pleurisy; pneumothorax; pulmonary collapse": 130,
    "Respiratory failure; insufficiency; arrest (adult)": 131,
    "Other lower respiratory disease": 133,
    "Other upper respiratory disease": 134,
    "Other liver diseases": 151,
    "Gastrointestinal hemorrhage": 153,
    "Acute and unspecified renal failure": 157,
    "Chronic kidney disease": 158,
    "Complications of surgical procedures or medical care": 238,
    "Shock": 249,
}

