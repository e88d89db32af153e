import { Alert, Button, Center, Paper, PasswordInput, Stack, TextInput, Title } from '@mantine/core'
import { useQueryClient } from '@tanstack/react-query'
import { useEffect, useState } from 'react'
import { useNavigate } from 'react-router'
import { api, setCurrentTenant } from '../api/client'
import { landingPath } from '../nav'

export function Login() {
  const [username, setUsername] = useState('')
  const [password, setPassword] = useState('')
  const [error, setError] = useState<string | null>(null)
  const [busy, setBusy] = useState(false)
  const navigate = useNavigate()
  const qc = useQueryClient()
  useEffect(() => {
    void api.GET('/api/v1/auth/session') // sets the csrftoken cookie the login POST needs (200 before login)
  }, [])
  const submit = async (e: React.FormEvent) => {
    e.preventDefault()
    setBusy(true)
    setError(null)
    const res = await api.POST('/api/v1/auth/login', { body: { username, password } })
    setBusy(false)
    if (!res.response.ok) {
      setError((res.error as { detail?: string })?.detail ?? `Login failed (HTTP ${res.response.status}).`)
      return
    }
    setCurrentTenant(res.data?.tenant ?? null)
    qc.setQueryData(['me'], res.data)
    // Operators land on the fleet; others on their tenant's adapters, or the tenant picker when they have several.
    navigate(res.data && (res.data.tenant || res.data.is_staff) ? landingPath(res.data) : '/')
  }
  return (
    <Center mih="100vh" p="md">
      <Paper withBorder p="xl" radius="md" w={380} maw="100%">
        <form onSubmit={submit} aria-label="Log in">
          <Stack>
            <Title order={2}>Log in to Quiver</Title>
            <TextInput label="Username" autoComplete="username" required value={username} onChange={(e) => setUsername(e.currentTarget.value)} />
            <PasswordInput label="Password" autoComplete="current-password" required value={password} onChange={(e) => setPassword(e.currentTarget.value)} />
            {error && (
              <Alert color="red" role="alert">
                {error}
              </Alert>
            )}
            <Button type="submit" loading={busy}>
              Log in
            </Button>
          </Stack>
        </form>
      </Paper>
    </Center>
  )
}
