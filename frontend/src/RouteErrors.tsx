// What the console shows instead of React Router's developer page: an unknown URL, or a page that failed to load
// or threw while rendering. Each names what happened and links back into the console.
import { Alert, Anchor, Button, Code, Group, Stack, Title } from '@mantine/core'
import { Link, useLocation, useRouteError } from 'react-router'
import { routeErrorMessage } from './routeError'

/** The `*` route: a URL no page answers (a mistyped link, a page from an older console). */
export function NotFound() {
  const { pathname } = useLocation()
  return (
    <Stack gap="md" maw={640}>
      <Title order={2}>Page not found</Title>
      <Alert color="yellow" role="alert" title="No console page has this address">
        Nothing lives at <Code>{pathname}</Code>. Check the address, or pick a page from the menu.
      </Alert>
      <Group>
        <Button component={Link} to="/">
          Go to the console's start page
        </Button>
      </Group>
    </Stack>
  )
}

/** `errorElement` of the console's routes: the error in words, with a reload and a way back to the start page. */
export function RouteError() {
  const { title, detail } = routeErrorMessage(useRouteError())
  return (
    <Stack gap="md" maw={640} p="md">
      <Title order={2}>{title}</Title>
      <Alert color="red" role="alert" title="Something went wrong">
        {detail}
      </Alert>
      <Group>
        <Button onClick={() => window.location.reload()}>Reload the page</Button>
        <Anchor component={Link} to="/">
          Go to the console's start page
        </Anchor>
      </Group>
    </Stack>
  )
}
