"""A local Gradio app: type a text, see exactly which tokens drove the model's output.

:func:`build_app` lays out the page for one loaded model and :func:`launch` serves it
(``captum-ffb app``, ``python -m captum_ffb.app``). Its tabs reuse the library's own views:

- *Contributions*: :func:`~captum_ffb.explain.explain_text`'s numbers (what ``captum-ffb
  explain`` computes), as :func:`~captum_ffb.viz.plot_contributions`' figure, a table of
  every token's contribution to every explained output (one column per generated token for
  a causal LM asked to generate) and the interactive page of
  :func:`~captum_ffb.viz.explanation_html` (first-token toggle, whole-model maps).
- *Layer maps*: the ``‖F_i(x_j)‖`` maps of :func:`~captum_ffb.texts.text.text_maps`: a layer,
  the scopes and the FF-amp panel chosen in the app (:func:`~captum_ffb.viz.plot_maps`),
  and the interactive :func:`~captum_ffb.viz.html_view` (scope picker, FF-amp overlay, hover).
- *Components*: the first output split over tokens × components
  (``explain_text(..., components=...)``, :func:`~captum_ffb.viz.plot_components`).
- *Graph*: the output's exact attribution graph (:func:`~captum_ffb.explain.graph_text`,
  what ``captum-ffb graph`` writes), pruned, on :func:`~captum_ffb.viz.graph_html`'s
  page (click a node for its edges and a head's query–key pairs).
- *Context* (causal LMs): a long context's paragraphs, sentences or lines as players
  (:func:`~captum_ffb.long_context.attribution.context_attribution`, what ``captum-ffb explain --context``
  computes, by the decomposition, by presence or by a surrogate fitted on ablations),
  :func:`~captum_ffb.viz.plot_context`'s figure and a table.

The server listens on 127.0.0.1 unless told otherwise, sends no telemetry (Gradio's
analytics are switched off before it is imported, and on the app) and needs no network: the
page's fonts and scripts come from the local Gradio package. Gradio is optional:
``pip install 'captum_ffb[app]'``.
"""

from __future__ import annotations

import io
import os
import re
from typing import TYPE_CHECKING, Any

from captum_ffb.core.vocabulary import FEATURE_GRANULARITIES

if TYPE_CHECKING:
    from captum_ffb.explain import Explanation
    from captum_ffb.explained.models import LoadedModel
    from captum_ffb.texts.text import TextMaps

#: How to install what the app needs.
INSTALL = "pip install 'captum_ffb[app]'"
#: The address the server listens on by default: this machine only.
DEFAULT_HOST = "127.0.0.1"
#: A sentence to start from, per task.
EXAMPLES = {
    "causal_lm": "The capital of France is",
    "sequence_classification": "a charming and often affecting journey.",
    "base": "a charming and often affecting journey.",
}
#: The most tokens a causal LM may be asked to generate in the app.
MAX_GENERATE = 64
#: Decimals of the numbers in the tables.
DECIMALS = 6
#: The component tables' granularities.
GRANULARITIES = FEATURE_GRANULARITIES["components"]
#: The buttons of the app's images (not Gradio's "share", which uploads).
IMAGE_BUTTONS = ["download", "fullscreen"]
NORMALIZATIONS = {"raw norms": "none", "rows sum to 1": "row", "columns sum to 1": "column"}


def import_gradio() -> Any:
    """Gradio, imported with its analytics switched off; a one-line ImportError naming the
    extra when it is not installed."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    try:
        import gradio
    except ImportError as error:
        raise ImportError(f"the Gradio app needs gradio: {INSTALL}") from error
    return gradio


def figure_image(figure: Any, dpi: int = 110) -> Any:
    """A matplotlib figure as a PIL image (Gradio's ``gr.Plot`` refuses figure subclasses)."""
    from PIL import Image

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    with Image.open(buffer) as image:
        return image.copy()


def contributions_table(explanation: Explanation) -> Any:
    r"""Every token's contribution to every explained output, as a pandas DataFrame.

    Rows are the tokens (``position``, ``token`` as people read it); each further column is
    one explained output, headed by its label. A generated token's column is blank for the
    positions it could not see. Values are rounded to ``DECIMALS`` decimals.
    """
    import pandas as pd

    columns: dict[str, list[Any]] = {"position": list(range(len(explanation.labels))),
                                      "token": list(explanation.labels)}
    for t, label in enumerate(explanation.target_labels):
        header = f'"{label}"' if explanation.steps == 1 else f'step {t + 1}: "{label}"'
        seen = explanation.prompt_length + t  # output t is read at position prompt_length - 1 + t
        columns[header] = [round(float(v), DECIMALS) if j < seen else None
                           for j, v in enumerate(explanation.contributions[t].tolist())]
    return pd.DataFrame(columns)


def summary_markdown(explanation: Explanation) -> str:
    """What was explained and, per output, ``value = Σ tokens + bias`` with the token share
    (``Σ tokens / value``), the convergence delta and the first-token share, as Markdown."""
    text = explanation.text if len(explanation.text) <= 200 else explanation.text[:197] + "..."
    text = re.sub(r"([\\`*_\[\]<>|~#])", r"\\\1", text)  # shown as typed, not as Markdown
    lines = [f"“{text}”: {len(explanation.tokens)} tokens on **{explanation.model_name}** "
             f"({explanation.model_type}). Explained: {explanation.explained}."]
    if explanation.steps == 0:
        lines.append("\nThis base model has no output to explain: see its maps in *Layer maps*.")
        return "\n".join(lines)
    shares, owned = explanation.first_token_share(), explanation.token_share()
    lines += ["", "| output | value | Σ tokens | bias | token share | delta | first-token share |",
              "|---|---|---|---|---|---|---|"]
    for t, label in enumerate(explanation.target_labels):
        total = float(explanation.contributions[t].sum())
        share = float(owned[t])
        lines.append(f"| `{label}` | {float(explanation.values[t]):.4f} | {total:.4f} | "
                     f"{float(explanation.bias[t]):.4f} | {'–' if share != share else f'{share:.0%}'} | "
                     f"{float(explanation.delta[t]):.1e} | {float(shares[t]):.0%} |")
    return "\n".join(lines)


def components_table(explanation: Explanation) -> Any:
    """The tokens × components table of an explanation (rows: tokens; columns: components),
    as a pandas DataFrame rounded to ``DECIMALS`` decimals."""
    import pandas as pd

    table = explanation.components
    values = table.contributions[0].detach().float().cpu()
    frame = pd.DataFrame(values.numpy().round(DECIMALS), columns=list(table.components))
    frame.insert(0, "token", list(table.tokens[0]))
    return frame


def maps_image(maps: TextMaps, layer: int, scopes: list[str], ff_amp: bool, normalize: str) -> Any:
    """:func:`~captum_ffb.viz.plot_maps` of one layer as an image."""
    from captum_ffb.viz.figures import plot_maps

    return figure_image(plot_maps(maps, layer=layer, scopes=scopes, ff_amp=ff_amp,
                                  normalize=NORMALIZATIONS.get(normalize, normalize)))


class AppEvents:
    """What the app's events do with one loaded model (the model runs one request at a time:
    every event that uses it shares one queue)."""

    def __init__(self, loaded: LoadedModel):
        from captum_ffb.architectures.heads import task_of
        from captum_ffb.explained.readouts import default_readout

        self.loaded = loaded
        self.task = task_of(loaded.model)
        self.has_output = default_readout(loaded.model) is not None
        names = getattr(loaded.model.config, "id2label", None) or {}
        classes = int(getattr(loaded.model.config, "num_labels", 0) or 0)
        self.class_choices = [("predicted", -1)] + [(f"{k}: {names.get(k, k)}", k) for k in range(classes)]

    def options(self, target: str, class_index: int | None, generate: float | None) -> dict[str, Any]:
        """``explain_text``'s options from the inputs that fit the model's task (a one-line
        error for an input the model cannot use, rather than leaving it out unsaid)."""
        if self.task == "causal_lm":
            return {"target": target or None, "generate": int(generate or 0)}
        name = type(self.loaded.model).__name__
        if target and target.strip():
            raise ValueError(f"a next token is explained by causal LMs; {name} is a {self.task} model")
        if generate:
            raise ValueError(f"generating needs a causal LM; {name} is a {self.task} model")
        if self.task == "sequence_classification" and class_index is not None and class_index >= 0:
            return {"class_index": int(class_index)}
        return {}

    def explain(self, text: str, target: str, class_index: int | None, generate: float | None,
                layer: int, scopes: list[str], ff_amp: bool, normalize: str) -> tuple:
        """The Contributions and Layer maps tabs for ``text``."""
        from captum_ffb.explain import explain_text
        from captum_ffb.texts.text import text_maps
        from captum_ffb.viz.explanation import explanation_html, plot_contributions
        from captum_ffb.viz.html import framed_page, html_view

        gr = import_gradio()
        try:
            explanation = explain_text(text, self.loaded, **self.options(target, class_index, generate))
            maps = text_maps(text, self.loaded)
        except ValueError as error:
            raise gr.Error(str(error)) from None
        figure = figure_image(plot_contributions(explanation)) if explanation.steps else None
        return (summary_markdown(explanation), figure, contributions_table(explanation),
                framed_page(explanation_html(explanation), height=620), maps,
                maps_image(maps, layer, scopes, ff_amp, normalize),
                framed_page(html_view(maps, layer=layer), height=780))

    def components(self, text: str, target: str, class_index: int | None,
                   granularity: str, show_progress: bool = False) -> tuple:
        """The Components tab: the first output split over tokens × components (with
        ``show_progress``, a bar over the table's passes, which Gradio shows on the tab)."""
        from captum_ffb.explain import explain_text
        from captum_ffb.viz.components import plot_components

        gr = import_gradio()
        try:
            options = {k: v for k, v in self.options(target, class_index, 0).items() if k != "generate"}
            explanation = explain_text(text, self.loaded, components=granularity, maps=False,
                                       show_progress=show_progress, **options)
        except ValueError as error:
            raise gr.Error(str(error)) from None
        title = f'"{explanation.target_labels[0]}": {explanation.explained}'
        return figure_image(plot_components(explanation.components, title=title)), components_table(explanation)

    def graph(self, text: str, target: str, class_index: int | None, corrupted: str | None, granularity: str,
              node_threshold: float) -> tuple:
        """The Graph tab: a summary and the graph's page."""
        from captum_ffb.explain import graph_text
        from captum_ffb.viz.graph import graph_html
        from captum_ffb.viz.html import framed_page

        gr = import_gradio()
        try:
            options = {k: v for k, v in self.options(target, class_index, 0).items() if k != "generate"}
            graph = graph_text(text, self.loaded, corrupted=(corrupted or "").strip() or None, granularity=granularity,
                               node_threshold=float(node_threshold), **options)
        except ValueError as error:
            raise gr.Error(str(error)) from None
        return graph_summary(graph), framed_page(graph_html(graph), height=720)

    def context(self, context: str, question: str, group_by: str, target: str,
                method: str = "decomposition") -> tuple:
        """The Context tab (causal LMs): the groups of a long context as players (``method``:
        ``context_attribution``'s), a figure of the largest and a table of all."""
        from captum_ffb.attr.norm_decomposition import NormDecomposition
        from captum_ffb.long_context.attribution import context_attribution
        from captum_ffb.texts.text import check_text
        from captum_ffb.viz.context import plot_context

        gr = import_gradio()
        try:
            if self.task != "causal_lm":
                raise ValueError(f"context attribution explains a causal LM's answer; "
                                 f"{type(self.loaded.model).__name__} is a {self.task} model")
            limit = getattr(self.loaded.model.config, "max_position_embeddings", None)
            found = context_attribution(NormDecomposition(self.loaded), self.loaded.tokenizer,
                                        check_text(context, name="the context"),
                                        check_text(question or "", name="the question"), group_by=group_by,
                                        target=target or None, max_tokens=limit, method=method)
        except ValueError as error:
            raise gr.Error(str(error)) from None
        import pandas as pd

        rows = pd.DataFrame([{"group": g["index"], "contribution": round(g["contribution"], 4),
                              "share": round(g["share"], 4), "tokens": g["tokens"], "text": g["text"][:200]}
                             for g in found.to_dict()["groups"]]).sort_values("contribution", key=abs, ascending=False)
        return figure_image(plot_context(found)), rows

    def redraw(self, maps: TextMaps | None, layer: int, scopes: list[str], ff_amp: bool,
               normalize: str) -> Any:
        """The Layer maps figure after a change of layer, scopes or options."""
        return redraw_maps(maps, layer, scopes, ff_amp, normalize)


def graph_summary(graph: Any) -> str:
    """What a graph explains and keeps, as Markdown."""
    d = graph.data
    residual = graph.flow_residual()
    return (f"Explained: `{graph.output_label}`, value {graph.value:.4f}. {len(d)} nodes, {len(d.weights)} edges; "
            f"kept {int(graph.node_mask.sum())} nodes and {int(graph.edge_mask.sum())} edges holding "
            f"{'–' if graph.kept_share != graph.kept_share else f'{graph.kept_share:.1%}'} of the output. "
            f"Largest flow residual {residual:.1e}.")


def redraw_maps(maps: TextMaps | None, layer: int, scopes: list[str], ff_amp: bool, normalize: str) -> Any:
    """A maps figure after a change of layer, scopes or options (``None`` before any maps)."""
    gr = import_gradio()
    if maps is None:
        return None
    try:
        return maps_image(maps, layer, scopes, ff_amp, normalize)
    except ValueError as error:
        raise gr.Error(str(error)) from None


class PairEvents:
    """The app's events for an encoder–decoder: a source, and its target or a generation."""

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded

    def explain(self, text: str, generate: float | None, layer: int, scopes: list[str], ff_amp: bool,
                normalize: str) -> tuple:
        """Every target token over the source and the prefix; the decoder's layer maps."""
        from captum_ffb.explain import explain_pair
        from captum_ffb.texts.text import PAIR_SEPARATOR, text_maps
        from captum_ffb.viz.html import framed_page, html_view
        from captum_ffb.viz.seq2seq import plot_seq2seq

        gr = import_gradio()
        try:
            pair = explain_pair(text, self.loaded, generate=0 if PAIR_SEPARATOR in text else int(generate or 0))
            target = text.split(PAIR_SEPARATOR, 1)[1] if PAIR_SEPARATOR in text else \
                self.loaded.tokenizer.decode(pair.result.tokens, skip_special_tokens=True).strip()
            maps = text_maps(f"{pair.source} {PAIR_SEPARATOR} {target}", self.loaded) if target.strip() else None
        except ValueError as error:
            raise gr.Error(str(error)) from None
        views = (pair.result, pair.source_tokens, pair.prefix_tokens, pair.target_tokens)
        summary = (f"{len(pair.source_tokens)} source tokens on **{pair.model_name}** ({pair.model_type}); each "
                   "target token's logit = Σ source + Σ target prefix + bias.\n\n" + pair.result.table(self.loaded.tokenizer))
        return (summary, figure_image(plot_seq2seq(*views)), pair_table(pair), maps,
                None if maps is None else maps_image(maps, layer, scopes, ff_amp, normalize),
                None if maps is None else framed_page(html_view(maps, layer=layer), height=780))


def pair_table(pair: Any) -> Any:
    """One row per explained target token: its logit, source share and the contribution of
    every source and target-prefix token (a pandas DataFrame)."""
    import pandas as pd

    r = pair.result
    frame = {"token": list(pair.target_tokens), "logit": r.value.tolist(),
             "source share": [round(float(v), DECIMALS) for v in r.source_share]}
    for j, token in enumerate(pair.source_tokens):
        frame[f"source {j}: {token}"] = [round(float(v), DECIMALS) for v in r.source[:, j]]
    for j, token in enumerate(pair.prefix_tokens):
        frame[f"prefix {j}: {token}"] = [round(float(v), DECIMALS) for v in r.target[:, j]]
    return pd.DataFrame(frame)


def scopes_of(loaded: LoadedModel) -> list[str]:
    """The scopes of a model's blocks (an encoder–decoder's decoder blocks), in the order its
    chain passes them."""
    from captum_ffb.architectures import get_architecture, get_chain

    spec = get_architecture(loaded.model_type)
    spec = spec.decoder or spec
    return list(get_chain(spec.chain_name(loaded.model.config)).scopes)


def _build_pair_app(loaded: LoadedModel) -> Any:
    """The app for an encoder–decoder (see :func:`build_app`)."""
    from captum_ffb.engine.model import find_blocks

    gr = import_gradio()
    events = PairEvents(loaded)
    n_layers = len(find_blocks(loaded.model, loaded.spec.decoder))
    scopes = scopes_of(loaded)
    queue = {"concurrency_id": "model", "concurrency_limit": 1}
    with gr.Blocks(analytics_enabled=False, title="captum_ffb: which source tokens fed each target token") as app:
        gr.Markdown(f"## Which source tokens fed each target token\n`{loaded.name}` ({loaded.model_type}, "
                    "encoder–decoder): type `SOURCE ||| TARGET` to explain a target, or a source alone to "
                    "generate one; every target token's logit is split exactly over the source and the "
                    "target prefix.")
        with gr.Row():
            text = gr.Textbox(label="Source ||| target (or the source alone)", lines=2, scale=4,
                              value="the cat sat on the mat ||| the dog", elem_id="ffb-text")
            with gr.Column(scale=1, min_width=220):
                generate = gr.Slider(0, MAX_GENERATE, value=10, step=1, elem_id="ffb-generate",
                                     label="Tokens to generate from a source alone")
                explain = gr.Button("Explain", variant="primary", elem_id="ffb-explain")
        with gr.Tabs():
            with gr.Tab("Contributions", id="contributions"):
                summary = gr.Markdown(elem_id="ffb-summary")
                figure = gr.Image(label="Contributions", format="png", interactive=False,
                                  buttons=IMAGE_BUTTONS, elem_id="ffb-figure")
                table = gr.Dataframe(label="Contribution of each token to each target token",
                                     interactive=False, elem_id="ffb-table", max_height=420)
            with gr.Tab("Decoder layer maps", id="maps"):
                maps_state = gr.State(None)
                with gr.Row():
                    layer = gr.Dropdown(list(range(n_layers)), value=n_layers - 1, label="Layer",
                                        elem_id="ffb-layer")
                    scope_picker = gr.CheckboxGroup(scopes, value=scopes, label="Scopes", elem_id="ffb-scopes")
                    ff_amp = gr.Checkbox(value=True, label="FF-amp panel (after FF − before FF)")
                    normalize = gr.Radio(list(NORMALIZATIONS), value="raw norms", label="Colour scale")
                maps_figure = gr.Image(label="Maps over [source | target]", format="png", interactive=False,
                                       buttons=IMAGE_BUTTONS, elem_id="ffb-maps")
                with gr.Accordion("Interactive view", open=True):
                    maps_view = gr.HTML(elem_id="ffb-maps-view")
        controls = [layer, scope_picker, ff_amp, normalize]
        request = dict(fn=events.explain, inputs=[text, generate, *controls],
                       outputs=[summary, figure, table, maps_state, maps_figure, maps_view], **queue)
        explain.click(**request)
        text.submit(**request)
        for control in controls:
            control.change(redraw_maps, inputs=[maps_state, *controls], outputs=maps_figure)
    return app


def build_app(loaded: LoadedModel) -> Any:
    r"""The app for one loaded model, as :class:`gradio.Blocks` (not launched).

    Args:
        loaded (LoadedModel): from :func:`captum_ffb.explained.models.load_model`.

    Returns:
        gradio.Blocks
    """
    if loaded.spec.decoder is not None:
        return _build_pair_app(loaded)
    gr = import_gradio()
    events = AppEvents(loaded)
    n_layers = len(loaded.blocks)
    scopes = scopes_of(loaded)
    queue = {"concurrency_id": "model", "concurrency_limit": 1}
    with gr.Blocks(analytics_enabled=False, title="captum_ffb: which tokens drove this output") as app:
        gr.Markdown(f"## Which tokens drove this output\n`{loaded.name}` ({loaded.model_type}, "
                    f"{events.task.replace('_', ' ')}): exact token contributions (NormDecomposition) "
                    "and token-to-token maps for every layer, computed on this machine.")
        text, target, generate, class_index, explain = _input_row(gr, events)
        with gr.Tabs():
            summary, figure, table, page = _contributions_tab(gr, events)
            maps_state, controls, maps_figure, maps_view = _maps_tab(gr, n_layers, scopes)
            granularity, split, components_outputs = _components_tab(gr, events)
            graph_inputs, build, graph_outputs = _graph_tab(gr, events)
            context_inputs, attribute_context, context_outputs = _context_tab(gr, events)
        request = dict(fn=events.explain, inputs=[text, target, class_index, generate, *controls],
                       outputs=[summary, figure, table, page, maps_state, maps_figure, maps_view], **queue)
        explain.click(**request)
        text.submit(**request)

        def split_with_progress(text: str, target: str, class_index: int | None, granularity: str,
                                progress: Any = gr.Progress(track_tqdm=True)) -> tuple:  # noqa: B008 (Gradio's way)
            """A long prompt's table takes a while: Gradio follows its progress bar."""
            return events.components(text, target, class_index, granularity, show_progress=True)

        split.click(split_with_progress, inputs=[text, target, class_index, granularity],
                    outputs=components_outputs, **queue)
        build.click(events.graph, inputs=[text, target, class_index, *graph_inputs],
                    outputs=graph_outputs, **queue)
        *texts, method = context_inputs
        attribute_context.click(events.context, inputs=[*texts, target, method],
                                outputs=context_outputs, **queue)
        for control in controls:
            control.change(events.redraw, inputs=[maps_state, *controls], outputs=maps_figure)
    return app


def _input_row(gr: Any, events: AppEvents) -> tuple[Any, Any, Any, Any, Any]:
    """The text and what to explain of it (a next token, generated tokens or a class), and the
    Explain button: ``(text, target, generate, class_index, explain)``."""
    with gr.Row():
        text = gr.Textbox(label="Text", value=EXAMPLES[events.task], lines=2, scale=4,
                          elem_id="ffb-text")
        with gr.Column(scale=1, min_width=220):
            causal = events.task == "causal_lm"
            target = gr.Textbox(label="Next token to explain (one token; the predicted one "
                                "if empty)", visible=causal, elem_id="ffb-target")
            generate = gr.Slider(0, MAX_GENERATE, value=0, step=1, visible=causal,
                                 label="Generate and explain N tokens", elem_id="ffb-generate")
            class_index = gr.Dropdown(events.class_choices, value=-1, label="Class",
                                      visible=events.task == "sequence_classification",
                                      elem_id="ffb-class")
            explain = gr.Button("Explain", variant="primary", elem_id="ffb-explain")
    return text, target, generate, class_index, explain


def _contributions_tab(gr: Any, events: AppEvents) -> tuple[Any, Any, Any, Any]:
    """The Contributions tab: ``(summary, figure, table, page)``."""
    with gr.Tab("Contributions", id="contributions"):
        summary = gr.Markdown(elem_id="ffb-summary")
        figure = gr.Image(label="Contributions", format="png", interactive=False,
                          buttons=IMAGE_BUTTONS, visible=events.has_output,
                          elem_id="ffb-figure")
        table = gr.Dataframe(label="Contribution of each token to each explained output",
                             interactive=False, elem_id="ffb-table", max_height=420)
        with gr.Accordion("Interactive page: first-token toggle, whole-model maps", open=False):
            page = gr.HTML(elem_id="ffb-page")
    return summary, figure, table, page


def _maps_tab(gr: Any, n_layers: int, scopes: list[str]) -> tuple[Any, list[Any], Any, Any]:
    """The Layer maps tab: ``(maps_state, [layer, scopes, ff_amp, normalize], figure, view)``."""
    with gr.Tab("Layer maps", id="maps"):
        maps_state = gr.State(None)
        with gr.Row():
            layer = gr.Dropdown(list(range(n_layers)), value=n_layers - 1, label="Layer",
                                elem_id="ffb-layer")
            scope_picker = gr.CheckboxGroup(scopes, value=scopes, label="Scopes",
                                            elem_id="ffb-scopes")
            ff_amp = gr.Checkbox(value=True, label="FF-amp panel (after FF − before FF)",
                                 elem_id="ffb-ffamp")
            normalize = gr.Radio(list(NORMALIZATIONS), value="raw norms", label="Colour scale")
        maps_figure = gr.Image(label="Maps", format="png", interactive=False,
                               buttons=IMAGE_BUTTONS, elem_id="ffb-maps")
        with gr.Accordion("Interactive view: scope picker, FF-amp overlay, hover", open=True):
            maps_view = gr.HTML(elem_id="ffb-maps-view")
    return maps_state, [layer, scope_picker, ff_amp, normalize], maps_figure, maps_view


def _components_tab(gr: Any, events: AppEvents) -> tuple[Any, Any, list[Any]]:
    """The Components tab: ``(granularity, split button, [figure, table])``."""
    with gr.Tab("Components", id="components", visible=events.has_output):
        gr.Markdown("The first explained output split over input tokens × components: the "
                    "direct effect of the embeddings and of each attention, FF or head.")
        with gr.Row():
            granularity = gr.Radio(list(GRANULARITIES), value="sublayer", label="Components")
            split = gr.Button("Split over components", elem_id="ffb-split")
        components_figure = gr.Image(label="Tokens × components", format="png",
                                     interactive=False, buttons=IMAGE_BUTTONS,
                                     elem_id="ffb-components")
        components_frame = gr.Dataframe(interactive=False, elem_id="ffb-components-table",
                                        max_height=420)
    return granularity, split, [components_figure, components_frame]


def _graph_tab(gr: Any, events: AppEvents) -> tuple[list[Any], Any, list[Any]]:
    """The Graph tab: ``([corrupted, granularity, node threshold], build button, [summary, view])``."""
    with gr.Tab("Graph", id="graph", visible=events.has_output):
        gr.Markdown("The output's exact attribution graph: tokens, every head (or sublayer) and FF "
                    "block at every position, the bias and the output; every edge exact, pruned "
                    "as circuit-tracer prunes. Click a node on the page for its edges.")
        with gr.Row():
            graph_granularity = gr.Radio(list(FEATURE_GRANULARITIES["graph"][:2]), value="head", label="Writer nodes")
            node_threshold = gr.Slider(0.1, 1.0, value=0.8, step=0.05, label="Node threshold")
            corrupted = gr.Textbox(label="Corrupted text of the same length (patching estimates; "
                                   "optional)", elem_id="ffb-corrupted")
            build = gr.Button("Build graph", elem_id="ffb-graph-build")
        graph_summary_ = gr.Markdown(elem_id="ffb-graph-summary")
        graph_view = gr.HTML(elem_id="ffb-graph-view")
    return [corrupted, graph_granularity, node_threshold], build, [graph_summary_, graph_view]


def _context_tab(gr: Any, events: AppEvents) -> tuple[list[Any], Any, list[Any]]:
    """The Context tab: ``([context, question, group_by, method], attribute button, [figure, table])``."""
    from captum_ffb.long_context.attribution import (
        DEFAULT_ABLATIONS,
        DEFAULT_FOCUS,
        DEFAULT_ROUNDS,
        METHODS,
    )

    with gr.Tab("Context", id="context", visible=events.task == "causal_lm"):
        gr.Markdown("A long context's parts as players: paste a document (or passages, a chat "
                    "history) and a question; every paragraph, sentence or line gets its exact "
                    "contribution to the answer's next token (decomposition, one backward pass) or "
                    "what removing it would do (presence, two gradients; fitted, presence refined by "
                    f"{DEFAULT_ABLATIONS} ablated prompts that remove only among the top {DEFAULT_FOCUS} "
                    f"groups of presence and the decomposition, and {DEFAULT_ROUNDS} prompts without the "
                    f"decomposition's top 1 to {DEFAULT_ROUNDS} groups).")
        with gr.Row():
            context_text = gr.Textbox(label="Context", lines=8, elem_id="ffb-context")
            with gr.Column():
                question = gr.Textbox(label="Question", elem_id="ffb-question")
                group_by = gr.Radio(["paragraph", "sentence", "line"], value="paragraph", label="Groups")
                method = gr.Radio(list(METHODS), value="decomposition", label="Method",
                                  info="decomposition: each group's exact share of the answer; presence: what "
                                       "removing it would do; fitted: presence refined by a fit on ablations",
                                  elem_id="ffb-context-method")
                attribute_context = gr.Button("Attribute", elem_id="ffb-context-run")
        context_figure = gr.Image(label="Groups by contribution", format="png", interactive=False,
                                  buttons=IMAGE_BUTTONS, elem_id="ffb-context-figure")
        context_frame = gr.Dataframe(interactive=False, elem_id="ffb-context-table", max_height=420)
    return [context_text, question, group_by, method], attribute_context, [context_figure, context_frame]


#: The names a page served on this machine only is reached by (the DNS-rebinding guard).
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def host_guard(host: str) -> dict[str, Any]:
    """The server's keyword arguments that refuse a request whose ``Host`` header is not this
    machine's (a page elsewhere rebinding its own name to 127.0.0.1 cannot reach the app),
    when the app listens on this machine only; nothing when it listens on other addresses."""
    if host not in LOCAL_HOSTS:
        return {}
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    return {"middleware": [Middleware(TrustedHostMiddleware, allowed_hosts=list(LOCAL_HOSTS))]}


def launch(
    model: LoadedModel | str | None = None,
    host: str = DEFAULT_HOST,
    port: int | None = None,
    block: bool = True,
    quiet: bool = False,
) -> Any:
    r"""Serve the app on ``host:port``.

    Args:
        model (LoadedModel or str, optional): a loaded model, or a folder or name for
                    :func:`~captum_ffb.explained.models.load_model`; the bundled all-MiniLM-L6-v2 by default.
        host (str): the address to listen on; this machine only by default.
        port (int, optional): the port; Gradio's first free one from 7860 by default.
        block (bool): serve until interrupted; ``False`` returns at once (tests, notebooks:
                    ``app.close()`` stops the server).
        quiet (bool): print nothing; else one line with the address.

    Returns:
        gradio.Blocks: the running app (its ``local_url`` is the page's address).
    """
    from captum_ffb.explained.models import LoadedModel, load_model

    import_gradio()
    if not isinstance(model, LoadedModel):
        model = load_model(model, show_progress=not quiet, task="auto")
    app = build_app(model)
    app.queue()
    app.launch(server_name=host, server_port=port, share=False, inbrowser=False, quiet=True,
               prevent_thread_lock=True, ssr_mode=False, mcp_server=False, show_error=True,
               app_kwargs=host_guard(host))
    if not quiet:
        reach = "this machine only" if host in (DEFAULT_HOST, "localhost") else f"listening on {host}"
        print(f"captum_ffb app: {app.local_url} ({reach}; Ctrl+C stops it)", flush=True)
    if block:
        app.block_thread()
    return app


__all__ = [
    "DEFAULT_HOST",
    "INSTALL",
    "AppEvents",
    "PairEvents",
    "LOCAL_HOSTS",
    "build_app",
    "components_table",
    "contributions_table",
    "figure_image",
    "host_guard",
    "import_gradio",
    "launch",
    "pair_table",
    "redraw_maps",
    "scopes_of",
    "summary_markdown",
]
