import '@mantine/core/styles.css'
import '@mantine/charts/styles.css'
import { MantineProvider, createTheme } from '@mantine/core'
import { QueryClient, QueryClientProvider } from '@tanstack/react-query'
import { StrictMode } from 'react'
import { createRoot } from 'react-dom/client'
import { RouterProvider, createBrowserRouter } from 'react-router'
import type { ComponentType } from 'react'
import { Landing, Shell } from './Shell'
import { Login } from './pages/Login'

// One chunk per page (React Router's `lazy`): the first load fetches the shell and the page it lands on only.
const page = (load: () => Promise<Record<string, unknown>>, name: string) => ({
  lazy: async () => ({ Component: (await load())[name] as ComponentType }),
})

const queryClient = new QueryClient({ defaultOptions: { queries: { retry: 1, refetchOnWindowFocus: false } } })
const theme = createTheme({ primaryColor: 'indigo', defaultRadius: 'md' })

const router = createBrowserRouter([
  { path: '/login', element: <Login /> },
  {
    path: '/',
    element: <Shell />,
    HydrateFallback: () => null,
    children: [
      { index: true, element: <Landing /> },
      { path: 'adapters', ...page(() => import('./pages/Adapters'), 'Adapters') },
      { path: 'adapters/:name', ...page(() => import('./pages/AdapterDetail'), 'AdapterDetail') },
      { path: 'keys', ...page(() => import('./pages/ApiKeys'), 'ApiKeys') },
      { path: 'playground', ...page(() => import('./pages/Playground'), 'Playground') },
      { path: 'usage', ...page(() => import('./pages/Usage'), 'Usage') },
      { path: 'members', ...page(() => import('./pages/Members'), 'Members') },
      { path: 'operator/nodes', ...page(() => import('./pages/Nodes'), 'Nodes') },
      { path: 'operator/residency', ...page(() => import('./pages/Residency'), 'Residency') },
      { path: 'operator/traffic', ...page(() => import('./pages/Traffic'), 'Traffic') },
      { path: 'operator/tenants', ...page(() => import('./pages/Tenants'), 'Tenants') },
      { path: 'operator/audit', ...page(() => import('./pages/Audit'), 'Audit') },
    ],
  },
])

createRoot(document.getElementById('root')!).render(
  <StrictMode>
    <MantineProvider theme={theme}>
      <QueryClientProvider client={queryClient}>
        <RouterProvider router={router} />
      </QueryClientProvider>
    </MantineProvider>
  </StrictMode>,
)
