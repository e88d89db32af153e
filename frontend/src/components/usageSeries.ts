// The usage chart's data, pure: which models get a line of their own, the "other" line, the points and the series
// (kept apart from the component so it can be tested and the component file exports components only).
import type { UsageSeriesRow } from '../api/client'
import { formatTime, modelLabel } from '../format'

export type Metric = 'requests' | 'completion_tokens' | 'prompt_tokens' | 'latency_ms_avg' | 'failures'

/** Tableau 10 (Maureen Stone's categorical palette, Tableau's and Vega's default: hues chosen to stay apart), its
 * first nine for models, one per line and never reused (issue 30: eight Mantine colours cycled, so the ninth model
 * drew in the first one's colour, and cyan beside teal read as one line). */
export const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f']
/** The line that sums the models past the palette: Tableau 10's grey, so it never reads as one more model. */
export const OTHER = '(other)'
const OTHER_COLOR = '#bab0ac'

/** Which models get a line of their own: every model when there are no more than PALETTE's colours, else the
 * busiest `PALETTE.length - 1` by requests over the period (ties by name) and the rest, two or more, summed into one
 * `OTHER` line (never an "other" of one model).
 * Ranked by requests whatever the metric, so switching metric never recolours a model. Both lists sorted by name. */
export function groupModels(rows: UsageSeriesRow[]): { shown: string[]; other: string[] } {
  const requests = new Map<string, number>()
  for (const r of rows) requests.set(r.model, (requests.get(r.model) ?? 0) + r.requests)
  const models = [...requests.keys()].sort()
  if (models.length <= PALETTE.length) return { shown: models, other: [] }
  const ranked = [...models].sort((a, b) => requests.get(b)! - requests.get(a)! || a.localeCompare(b))
  const shown = new Set(ranked.slice(0, PALETTE.length - 1))
  return { shown: models.filter((m) => shown.has(m)), other: models.filter((m) => !shown.has(m)) }
}

/** The chart's data key for a model: the name as sent, `(no model)` for a refused request with none (an empty key
 * draws nothing in Recharts). Adapter names are slugs, so neither `(no model)` nor OTHER can be a model's name. */
const seriesKey = (model: string) => modelLabel(model)

/** Pivots rows `{t, model, <metric>}` into chart points `{t, [model]: value}`, oldest first, with the models past
 * the palette as one OTHER value per point: their sum, or for `latency_ms_avg` their request-weighted mean. */
export function pivot(rows: UsageSeriesRow[], metric: Metric): { data: Record<string, string | number>[]; models: string[] } {
  const { shown, other } = groupModels(rows)
  const grouped = new Set(other)
  const keys = [...shown.map(seriesKey), ...(other.length ? [OTHER] : [])]
  const byT = new Map<string, Record<string, string | number>>()
  const otherWeight = new Map<string, { sum: number; requests: number }>() // latency: Σ avg × requests, Σ requests
  for (const r of rows) {
    const point = byT.get(r.t) ?? { t: formatTime(r.t, { seconds: false }) }
    byT.set(r.t, point)
    if (!grouped.has(r.model)) {
      point[seriesKey(r.model)] = r[metric]
    } else if (metric === 'latency_ms_avg') {
      const w = otherWeight.get(r.t) ?? { sum: 0, requests: 0 }
      w.sum += r.latency_ms_avg * r.requests
      w.requests += r.requests
      otherWeight.set(r.t, w)
      point[OTHER] = w.requests ? w.sum / w.requests : 0
    } else {
      point[OTHER] = Number(point[OTHER] ?? 0) + r[metric]
    }
  }
  const data = [...byT.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([, p]) => p)
  for (const p of data) for (const k of keys) p[k] ??= 0
  return { data, models: keys }
}

/** One line per series key of `pivot`, each its own colour, named in the legend as the application calls the model
 * (`capitals`, `capitals@3`); OTHER reads `other (N models)`. */
export function usageSeries(models: string[], otherCount = 0) {
  return models.map((m, i) =>
    m === OTHER
      ? { name: m, label: `other (${otherCount} models)`, color: OTHER_COLOR }
      : { name: m, label: m, color: PALETTE[i % PALETTE.length] },
  )
}
