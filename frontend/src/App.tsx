// Placeholder page: the tenant console is not built yet (see frontend/README.md for what it will hold).
const PLANNED = [
  'Adapters: upload a PEFT folder, follow validation (uploaded → validating → ready | rejected) and read the report',
  'Residency: where each adapter version is loaded (cold, staged, warm, hot, errored; pinned)',
  'API keys: create (secret shown once), revoke, expiry, last used',
  'Usage: prompt and completion tokens per adapter version',
  'Nodes: health and KV-cache pressure (vllm:kv_cache_usage_perc, running / waiting requests)',
]

export default function App() {
  return (
    <main>
      <h1>Quiver</h1>
      <p>Multi-tenant LoRA adapter serving on shared vLLM nodes.</p>
      <p>
        This console is a placeholder. Today everything is done through the REST API (<code>/api/v1/</code>) and the
        OpenAI-compatible gateway (<code>/v1/</code>) with a tenant API key.
      </p>
      <h2>Planned</h2>
      <ul>
        {PLANNED.map((item) => (
          <li key={item}>{item}</li>
        ))}
      </ul>
    </main>
  )
}
