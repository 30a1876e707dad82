"""The JavaScript a page inlines: Vega, Vega-Lite and vega-embed in one bundle, from vl-convert-python (which ships
them; built once per process, a few seconds), and the notice their BSD-3-Clause licence asks a copy to carry."""
from __future__ import annotations

import functools

from kvcli.errors import KvcliError

INSTALL = "pip install 'vl-convert-python>=1.7'"  # 1.7: the first that names its libraries' versions

#: the licence of Vega, Vega-Lite and vega-embed (the same text for each, University of Washington Interactive
#: Data Lab), carried in every page that inlines them.
LICENSE = """Vega, Vega-Lite and vega-embed: Copyright (c) 2015-2025, University of Washington Interactive Data Lab.
All rights reserved.

Redistribution and use in source and binary forms, with or without modification, are permitted provided that the
following conditions are met:
1. Redistributions of source code must retain the above copyright notice, this list of conditions and the following
   disclaimer.
2. Redistributions in binary form must reproduce the above copyright notice, this list of conditions and the
   following disclaimer in the documentation and/or other materials provided with the distribution.
3. Neither the name of the copyright holder nor the names of its contributors may be used to endorse or promote
   products derived from this software without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS" AND ANY EXPRESS OR IMPLIED WARRANTIES,
INCLUDING, BUT NOT LIMITED TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL,
SPECIAL, EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF LIABILITY,
WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE."""


def _vl_convert():
    try:
        import vl_convert
    except ImportError:
        raise KvcliError(f"the HTML report inlines the Vega JavaScript from vl-convert-python: {INSTALL}") from None
    return vl_convert


@functools.cache
def bundle() -> str:
    """The bundle (about 0.9 MB of minified JavaScript with vl-convert-python 1.9) that sets ``window.vegaEmbed``,
    ``window.vega`` and ``window.vegaLite``, for a ``<script type="module">``.

    Raises:
        KvcliError: vl-convert-python is not installed.
    """
    return _vl_convert().javascript_bundle()


@functools.cache
def versions() -> dict[str, str]:
    """The bundled libraries' versions: ``{"vega": "6.2.0", "vega-lite": "6.4", "vega-embed": "7.0.2"}``.

    Raises:
        KvcliError: vl-convert-python is not installed, or older than 1.7.
    """
    vlc = _vl_convert()
    try:
        return {"vega": vlc.get_vega_version(), "vega-lite": vlc.get_vegalite_versions()[-1],
                "vega-embed": vlc.get_vega_embed_version()}
    except AttributeError:
        raise KvcliError(f"the HTML report needs a newer vl-convert-python: {INSTALL}") from None
