// The typed API client: openapi-fetch over the schema generated from Django's OpenAPI document
// (drf-spectacular → src/api/openapi.json → openapi-typescript → src/api/schema.d.ts; `npm run gen:api`).
// Every call carries the session cookie, the CSRF token on unsafe methods and the chosen tenant.
import createClient, { type Middleware } from 'openapi-fetch'
import type { components, paths } from './schema'

export type Schemas = components['schemas']
export type Adapter = Schemas['AdapterOutput']
export type AdapterVersion = Schemas['AdapterVersionOutput']
export type ApiKey = Schemas['ApiKeyOutput']
export type ApiKeyCreated = Schemas['ApiKeyCreated']
export type Me = Schemas['Me']
export type UsageSeriesRow = Schemas['UsageSeriesRow']
export type Node = Schemas['NodeOutput']
export type Placement = Schemas['PlacementOutput']
export type ResidencyRow = Schemas['ResidencyMapRow']
export type NodeSample = Schemas['NodeSample']
export type TrafficRow = Schemas['TrafficRow']
export type OperatorTenant = Schemas['OperatorTenant']
export type MyInvitation = Schemas['MyInvitation']
export type Invitation = Schemas['InvitationOutput']

/** The API's error envelope: `{detail, code, fields?}`. */
export interface ApiError {
  detail: string
  code: string
  fields?: Record<string, unknown>
}

const TENANT_KEY = 'quiver.tenant'
const UNSAFE = new Set(['POST', 'PUT', 'PATCH', 'DELETE'])

export function csrfToken(): string {
  const match = document.cookie.split('; ').find((c) => c.startsWith('csrftoken='))
  return match ? decodeURIComponent(match.slice('csrftoken='.length)) : ''
}

export function currentTenant(): string | null {
  return localStorage.getItem(TENANT_KEY)
}

export function setCurrentTenant(slug: string | null): void {
  if (slug) localStorage.setItem(TENANT_KEY, slug)
  else localStorage.removeItem(TENANT_KEY)
}

/** Headers every console call sends: CSRF token for unsafe methods, and the chosen tenant. */
export function consoleHeaders(method: string): Record<string, string> {
  const headers: Record<string, string> = {}
  if (UNSAFE.has(method.toUpperCase())) headers['X-CSRFToken'] = csrfToken()
  const tenant = currentTenant()
  if (tenant) headers['X-Quiver-Tenant'] = tenant
  return headers
}

const sessionMiddleware: Middleware = {
  onRequest({ request }) {
    for (const [k, v] of Object.entries(consoleHeaders(request.method))) request.headers.set(k, v)
    return request
  },
}

export const api = createClient<paths>({ baseUrl: '', credentials: 'same-origin' })
api.use(sessionMiddleware)

/** Unwraps an openapi-fetch result: the data, or throws the API's error envelope. */
export function unwrap<T>(result: { data?: T; error?: unknown; response: Response }): T {
  if (result.error !== undefined || !result.response.ok) {
    const err = (result.error ?? {}) as Partial<ApiError>
    throw Object.assign(new Error(err.detail ?? `HTTP ${result.response.status}`), {
      code: err.code ?? 'http_error',
      status: result.response.status,
      fields: err.fields,
    })
  }
  return result.data as T
}
