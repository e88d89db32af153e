// How the console writes instants: the user's locale for the date, always a 24-hour clock, in the browser's time
// zone. Every page and chart goes through these, so a time reads the same everywhere ("21:49:32", never "9:49:32 PM").

export type TimeInput = string | number | Date

/** `timeZone` and `locale` default to the browser's; tests pin them. */
export type FormatOptions = { timeZone?: string; locale?: string }

// hourCycle 'h23', not hour12: false, which some engines and locales render midnight with as "24:00".
const CLOCK = { hourCycle: 'h23', hour: '2-digit', minute: '2-digit' } as const

const toDate = (value: TimeInput) => (value instanceof Date ? value : new Date(value))
/** What an unreadable instant shows (Intl throws a RangeError on an invalid date, which would take the page down). */
const NO_TIME = '—'
const valid = (d: Date) => !Number.isNaN(d.getTime())

/** A date and time: the locale's date order with the month as a word, then a 24-hour `HH:MM:SS` ("Dec 7, 2026,
 * 21:49:32" in en-US, "7 Dec 2026, 21:49:32" in en-GB). All-digit dates ("12/07/2026") read as July in most of the
 * world and December in the US. */
export function formatDateTime(value: TimeInput, opts: FormatOptions = {}): string {
  const date = toDate(value)
  if (!valid(date)) return NO_TIME
  return new Intl.DateTimeFormat(opts.locale, {
    year: 'numeric', month: 'short', day: 'numeric', ...CLOCK, second: '2-digit', timeZone: opts.timeZone,
  }).format(date)
}

/** A time of day on a 24-hour clock: `HH:MM:SS`, or `HH:MM` with `seconds: false` (chart axes). */
export function formatTime(value: TimeInput, opts: FormatOptions & { seconds?: boolean } = {}): string {
  const date = toDate(value)
  if (!valid(date)) return NO_TIME
  return new Intl.DateTimeFormat(opts.locale, {
    ...CLOCK, ...(opts.seconds === false ? {} : { second: '2-digit' }), timeZone: opts.timeZone,
  }).format(date)
}

const SECOND = 1000
const MINUTE = 60 * SECOND
const HOUR = 60 * MINUTE
const DAY = 24 * HOUR
/** Round steps a time axis may use, smallest first. */
const TICK_STEPS = [
  ...[1, 2, 5, 10, 15, 30].map((s) => s * SECOND),
  ...[1, 2, 5, 10, 15, 30].map((m) => m * MINUTE),
  ...[1, 2, 3, 6, 12].map((h) => h * HOUR),
]

/** Evenly spaced instants (ms) for a time axis over `[from, to]`: the smallest round step (10 s, 1 min, 15 min, 1 h, …)
 * that gives at most `count` ticks, each on a multiple of the step by the clock of the zone `utcOffsetMinutes` east of
 * UTC (default: the browser's), so an hour reads 21:00, 21:15, 21:30, 21:45 rather than wherever the samples fell. */
export function timeTicks(from: number, to: number, count = 5, utcOffsetMinutes = -new Date(from).getTimezoneOffset()): number[] {
  if (!(to > from)) return Number.isFinite(from) ? [from] : []
  const span = to - from
  const step = TICK_STEPS.find((s) => Math.floor(span / s) + 1 <= count) ?? Math.ceil(span / (count - 1) / DAY) * DAY
  const offset = utcOffsetMinutes * MINUTE
  const ticks: number[] = []
  for (let t = Math.ceil((from + offset) / step) * step - offset; t <= to; t += step) ticks.push(t)
  return ticks
}

/** How a tick of a time axis with these `ticks` reads: seconds only when the step is under a minute. */
export function tickFormat(ticks: number[]): (t: number) => string {
  const seconds = ticks.length > 1 && ticks[1] - ticks[0] < MINUTE
  return (t) => formatTime(t, { seconds })
}

/** `name` and the pinned version of a model as an application sends it (`capitals` or `capitals@3`). */
function splitModel(model: string): { name: string; pinned: number | null } {
  const m = /^(.+)@(\d+)$/.exec(model)
  return m ? { name: m[1], pinned: Number(m[2]) } : { name: model, pinned: null }
}

/** How the console names a refused request's model when none was found (stored as `""`). */
export const NO_MODEL = '(no model)'

/** The one way the console names an adapter version: `capitals v3`; the base model reads `tiny-llama (base)`.
 * `model` may be what the application sent, `name@3` included; `version` is the version that answered (null: the
 * base model). An empty `model` is a refused request whose model was never found (the server does not store names
 * no model has): `(no model)`. */
export function versionLabel(model: string, version: number | null): string {
  if (!model) return NO_MODEL
  const { name } = splitModel(model)
  return version == null ? `${name} (base)` : `${name} v${version}`
}

/** A model name as the application sent it, where the version that answered is not known (usage charts): the
 * served name itself (`capitals`, `capitals@3`: what a client puts in `model`), `(no model)` for a refused request
 * whose model was never found. */
export function modelLabel(model: string): string {
  return model || NO_MODEL
}

/** Whole from 10 up, else two significant digits (`2.5`, `0.27`, `0.0042`): never rounded to 0. */
const twoDigits = (v: number) => (v >= 10 ? Math.round(v).toString() : String(Number(v.toPrecision(2))))

/** A rate for people, of requests or tokens: per second from 1/s up (`2.5/s`, `42/s`), per minute from 1/min
 * (`30/min`), per hour below (`16/h`, `0.042/h`), two significant digits under 10, so a low but real rate never
 * reads as `0.0/s` (1 token in a day is `0.042/h`). `perSecond` is events per second (≥ 0). */
export function formatRate(perSecond: number): string {
  if (!Number.isFinite(perSecond) || perSecond <= 0) return '0/s'
  if (perSecond >= 1) return `${twoDigits(perSecond)}/s`
  if (perSecond * 60 >= 1) return `${twoDigits(perSecond * 60)}/min`
  return `${twoDigits(perSecond * 3600)}/h`
}
