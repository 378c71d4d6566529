"""The languages of a page's visible text, ranked, as Common Crawl records them: CLD2 (pycld2, compiled C++, its
model in the wheel: nothing is downloaded) and ISO-639-3 codes. Pure (no Spark, no I/O): parse calls it per page.

CLD2 is what Common Crawl runs for its `content_languages`, it is the fastest of the candidates measured on parse's
hot path (docs/outputs.md, bench/README.md) and it reports a mixed-language text as up to three languages with the
share of the text each covers. Only the first `max_chars` characters are read, so a long page costs no more than
a short one. A text CLD2 is not sure of (too little text, gibberish, digits, a script it does not know) has no
languages (None): a recorded outcome, not an error.
"""

from __future__ import annotations

import re
from typing import TypedDict

import pycld2

# CLD2's code of every language it can detect (pycld2.DETECTED_LANGUAGES) -> ISO-639-3, the codes Common Crawl's
# `content_languages` holds (ISO 639-2/T, which is 639-3 for individual languages; macrolanguages keep their
# macrolanguage code: zho, ara, msa, nor). CLD2's traditional Chinese is zho too. Pig Latin (zzp) is left out.
_ISO_639_3 = {
    "aa": "aar", "ab": "abk", "af": "afr", "ak": "aka", "am": "amh", "ar": "ara", "as": "asm", "ay": "aym",
    "az": "aze", "ba": "bak", "be": "bel", "bg": "bul", "bh": "bih", "bi": "bis", "bn": "ben", "bo": "bod",
    "br": "bre", "bs": "bos", "ca": "cat", "ceb": "ceb", "chr": "chr", "co": "cos", "crs": "crs", "cs": "ces",
    "cy": "cym", "da": "dan", "de": "deu", "dv": "div", "dz": "dzo", "el": "ell", "en": "eng", "eo": "epo",
    "es": "spa", "et": "est", "eu": "eus", "fa": "fas", "fi": "fin", "fj": "fij", "fo": "fao", "fr": "fra",
    "fy": "fry", "ga": "gle", "gd": "gla", "gl": "glg", "gn": "grn", "gu": "guj", "gv": "glv", "ha": "hau",
    "haw": "haw", "hi": "hin", "hmn": "hmn", "hr": "hrv", "ht": "hat", "hu": "hun", "hy": "hye", "ia": "ina",
    "id": "ind", "ie": "ile", "ig": "ibo", "ik": "ipk", "is": "isl", "it": "ita", "iu": "iku", "iw": "heb",
    "ja": "jpn", "jw": "jav", "ka": "kat", "kha": "kha", "kk": "kaz", "kl": "kal", "km": "khm", "kn": "kan",
    "ko": "kor", "ks": "kas", "ku": "kur", "ky": "kir", "la": "lat", "lb": "ltz", "lg": "lug", "lif": "lif",
    "ln": "lin", "lo": "lao", "lt": "lit", "lv": "lav", "mfe": "mfe", "mg": "mlg", "mi": "mri", "mk": "mkd",
    "ml": "mal", "mn": "mon", "mr": "mar", "ms": "msa", "mt": "mlt", "my": "mya", "na": "nau", "ne": "nep",
    "nl": "nld", "nn": "nno", "no": "nor", "nr": "nbl", "nso": "nso", "ny": "nya", "oc": "oci", "om": "orm",
    "or": "ori", "pa": "pan", "pl": "pol", "ps": "pus", "pt": "por", "qu": "que", "rm": "roh", "rn": "run",
    "ro": "ron", "ru": "rus", "rw": "kin", "sa": "san", "sco": "sco", "sd": "snd", "sg": "sag", "si": "sin",
    "sk": "slk", "sl": "slv", "sm": "smo", "sn": "sna", "so": "som", "sq": "sqi", "sr": "srp", "ss": "ssw",
    "st": "sot", "su": "sun", "sv": "swe", "sw": "swa", "syr": "syr", "ta": "tam", "te": "tel", "tg": "tgk",
    "th": "tha", "ti": "tir", "tk": "tuk", "tl": "tgl", "tlh": "tlh", "tn": "tsn", "to": "ton", "tr": "tur",
    "ts": "tso", "tt": "tat", "ug": "uig", "uk": "ukr", "ur": "urd", "uz": "uzb", "ve": "ven", "vi": "vie",
    "vo": "vol", "war": "war", "wo": "wol", "xh": "xho", "xx-Bugi": "bug", "xx-Goth": "got", "yi": "yid",
    "yo": "yor", "za": "zha", "zh": "zho", "zh-Hant": "zho", "zu": "zul",
}
# C0/C1 control characters (but tab and newlines): CLD2 rejects a text holding one as invalid UTF-8.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class Language(TypedDict):
    code: str     # ISO-639-3
    share: float  # the part of the text (0-1) CLD2 assigns to this language


def detect_languages(text: str, max_chars: int) -> list[Language] | None:
    """The languages of `text`'s first `max_chars` characters, most of the text first (at most three), or None when
    there are none CLD2 is sure of (`max_chars` 0: detection off)."""
    sample = _CONTROL.sub(" ", text[:max_chars]).encode("utf-8", "replace")  # "replace": a lone surrogate
    if not sample.strip():
        return None
    try:
        reliable, _, ranked = pycld2.detect(sample, isPlainText=True)
    except pycld2.error:  # what the cleaning above does not catch (e.g. noncharacters): no languages, never a failure
        return None
    if not reliable:
        return None
    found: dict[str, float] = {}
    for _, cld2_code, percent, _ in ranked:
        code = _ISO_639_3.get(cld2_code)
        if code is not None and percent > 0:
            found[code] = found.get(code, 0.0) + percent / 100  # zh and zh-Hant are one code
    return [Language(code=code, share=share) for code, share in found.items()] or None

